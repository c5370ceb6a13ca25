//! Resource usage of the sandbox.

use super::*;

/// CPU time (ticks) per pid at the previous sample, to turn totals into a rate.
pub(super) static LAST_CPU: Mutex<Option<(std::time::Instant, u64)>> = Mutex::new(None);

pub(super) fn sample_metrics() -> Metrics {
    let page = sys::page_size();
    let mut ticks = 0u64;
    let mut rss = 0u64;
    for pid in sandbox_pids() {
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            if let Some((_, rest)) = stat.rsplit_once(')') {
                let fields: Vec<&str> = rest.split_whitespace().collect();
                // After the command: state is field 0; utime 11, stime 12, rss 21.
                let num = |i: usize| {
                    fields
                        .get(i)
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                ticks += num(11) + num(12);
                rss += num(21) * page;
            }
        }
    }
    let now = std::time::Instant::now();
    let mut last = LAST_CPU.lock().unwrap_or_else(|e| e.into_inner());
    let cpu_used_pct = match *last {
        Some((then, before)) if now > then => {
            let secs = now.duration_since(then).as_secs_f64();
            let used = ticks.saturating_sub(before) as f64 / sys::clock_ticks() as f64;
            (used / secs * 100.0).max(0.0)
        }
        _ => 0.0,
    };
    *last = Some((now, ticks));
    let mem_total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024;
    let (disk_total, disk_free) = sys::fs_usage(Path::new("/")).unwrap_or((0, 0));
    Metrics {
        timestamp: now_millis(),
        cpu_used_pct,
        cpu_count: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        mem_used: rss,
        mem_total,
        disk_used: disk_total.saturating_sub(disk_free),
        disk_total,
    }
}
