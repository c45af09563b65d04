//! The `mesh` executable: parses the command line and hands it to the crate
//! that runs it: `mesh daemon` to `mesh-daemon`, `mesh bench` to
//! `mesh-bench`, `mesh mcp` to `mesh-mcp`, every other command to `mesh-cli`.

use std::process::ExitCode;

use mesh_cli::{Cli, Command};

fn main() -> ExitCode {
    let mut cli = Cli::parse_args();
    let result = cli.data_dir().and_then(|dir| {
        // The daemon and the bench take their command; the rest take the
        // whole command line (the agent flags).
        match std::mem::replace(&mut cli.command, Command::Id) {
            Command::Daemon { bind, log_format } => {
                let format = log_format
                    .map(|f| f.parse().map_err(mesh_cli::UsageError))
                    .transpose()?;
                Ok(mesh_daemon::run_foreground(dir, bind, format)?)
            }
            Command::Bench(cmd) => mesh_bench::run(cmd, &dir),
            Command::Mcp => {
                let (client, agent) = mesh_cli::agent_client(&cli, &dir)?;
                mesh_mcp::run(client, &agent)
            }
            command => {
                cli.command = command;
                let bin = std::env::current_exe()?;
                mesh_cli::run(cli, &dir, &bin)
            }
        }
    });
    mesh_cli::finish(result)
}
