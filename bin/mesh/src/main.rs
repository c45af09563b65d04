//! The `mesh` executable: parses the command line and hands it to the crate
//! that runs it: `mesh daemon` to `mesh-daemon`, `mesh bench` to
//! `mesh-bench`, every other command to `mesh-cli`.

use std::process::ExitCode;

use mesh_cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse_args();
    let result = cli.data_dir().and_then(|dir| match cli.command {
        Command::Daemon { bind } => Ok(mesh_daemon::run_foreground(dir, bind)?),
        Command::Bench(cmd) => mesh_bench::run(cmd, &dir),
        command => {
            let bin = std::env::current_exe()?;
            mesh_cli::run(command, &dir, &bin)
        }
    });
    mesh_cli::finish(result)
}
