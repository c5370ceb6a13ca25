//! Create a sandbox on the embedded engine, look around inside it, destroy it.
//!
//! `cargo run -p sandcove --example hello`

use sandcove::{Client, Command, CreateOptions, ProcessSpec};

#[tokio::main]
async fn main() -> sandcove::Result<()> {
    let client = Client::from_env()?;
    let sandbox = client.create(CreateOptions::default()).await?;
    println!("sandbox {} created", sandbox.id());
    let out = sandbox
        .run(ProcessSpec::new(Command::sh("uname -a; id; ls /")))
        .await?;
    print!("{}", out.stdout_lossy());
    eprint!("{}", out.stderr_lossy());
    sandbox.destroy().await?;
    println!("sandbox destroyed (exit code {})", out.exit_code());
    Ok(())
}
