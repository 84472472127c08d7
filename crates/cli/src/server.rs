//! `tollgate server`: run the controller until SIGINT or SIGTERM.

use std::process::ExitCode;

use tollgate_server::{Server, ServerOptions, shutdown_signal};

/// Binds, prints where it listens (tests read this line), and serves.
pub fn run(opts: ServerOptions) -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        let server = Server::bind(&opts).await?;
        crate::say(format!(
            "tollgate server listening: grpc {} http {} data {}",
            server.grpc_addr(),
            server.http_addr(),
            opts.data.display()
        ));
        tracing::info!(grpc = %server.grpc_addr(), http = %server.http_addr(), "serving");
        server.run(shutdown_signal()).await?;
        tracing::info!("stopped");
        Ok(ExitCode::SUCCESS)
    })
}
