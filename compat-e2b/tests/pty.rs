//! `sandbox.pty`, against the embedded runtime.

mod common;

use common::{assert_not_supported, caps, sandbox, skip};
use e2b::PtySize;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_follows_the_capability() {
    let sbx = sandbox("pty").await;
    let created = sbx.pty.create(PtySize::new(24, 80)).await;
    if caps().pty {
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
        let mut out = Vec::new();
        while let Some(item) = terminal.next().await {
            let (stdout, stderr, pty) = item.expect("item");
            assert!(stdout.is_none() && stderr.is_none());
            out.extend(pty.expect("pty bytes"));
        }
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains("30 100") && text.contains("xterm-256color"),
            "{text}"
        );
        let again = sbx.pty.create(PtySize::new(24, 80)).await.expect("pty");
        assert!(sbx.pty.kill(again.pid).await.expect("kill"));
        assert!(!sbx.pty.kill(999_999).await.expect("kill unknown"));
    } else {
        skip("pty.create / resize / send_stdin / kill", "pty");
        assert_not_supported(created, "pty.create");
    }
    assert!(sbx
        .pty
        .create(PtySize::new(0, 80))
        .await
        .unwrap_err()
        .is_invalid_argument());
    sbx.kill().await.expect("kill");
}
