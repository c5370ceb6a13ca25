//! `sandbox.pty`, against the embedded runtime.

use std::sync::{Arc, Mutex};

use crate::common::{assert_not_supported, caps, sandbox, skip};
use e2b::PtySize;

/// What a [`collector`] callback was given.
type Seen = Arc<Mutex<Vec<u8>>>;

/// An `on_data` callback that keeps what it is given.
fn collector() -> (Seen, impl FnMut(Vec<u8>) + Send + 'static) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    (seen, move |data: Vec<u8>| sink.lock().unwrap().extend(data))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_follows_the_capability() {
    let sbx = sandbox("pty").await;
    let (seen, on_data) = collector();
    // The async class's shape: `pty.create(size, on_data)`.
    let created = sbx.pty.create(PtySize::new(24, 80), on_data).await;
    if caps().await.pty {
        let mut terminal = created.expect("pty");
        let pid = terminal.pid;
        sbx.pty
            .resize(
                pid,
                PtySize {
                    rows: 30,
                    cols: 100,
                },
            )
            .await
            .expect("resize");
        sbx.pty
            .send_stdin(pid, b"stty size; echo $TERM; exit\n")
            .await
            .expect("send");
        // `on_data` is called from the handle's own task as the terminal writes (see
        // `commands::background_callbacks_fire_before_anyone_waits`); `wait` awaits it, and
        // the output went to the callback, not to iteration.
        terminal.wait().await.expect("wait");
        let text = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
        assert!(
            text.contains("30 100") && text.contains("xterm-256color"),
            "{text}"
        );
        assert!(terminal.next().await.is_none());

        let again = sbx
            .pty
            .create(PtySize::new(24, 80), |_| {})
            .await
            .expect("pty");
        // `pty.connect(pid, on_data)`: the reattached handle feeds its own callback.
        let (seen_again, on_data) = collector();
        let mut attached = sbx.pty.connect(again.pid, on_data).await.expect("connect");
        sbx.pty
            .send_stdin(again.pid, b"echo conn$((6*7))ected; exit\n")
            .await
            .expect("send");
        attached.wait().await.expect("wait");
        let text = String::from_utf8_lossy(&seen_again.lock().unwrap()).into_owned();
        assert!(text.contains("conn42ected"), "{text}");

        let third = sbx
            .pty
            .create(PtySize::new(24, 80), |_| {})
            .await
            .expect("pty");
        assert!(sbx.pty.kill(third.pid).await.expect("kill"));
        assert!(!sbx.pty.kill(999_999).await.expect("kill unknown"));
    } else {
        skip("pty.create / resize / send_stdin / kill", "pty");
        assert_not_supported(created, "pty.create");
    }
    assert!(sbx
        .pty
        .create(PtySize::new(0, 80), |_| {})
        .await
        .unwrap_err()
        .is_invalid_argument());
    sbx.kill().await.expect("kill");
}
