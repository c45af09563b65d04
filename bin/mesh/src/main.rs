//! The `mesh` executable: parses the command line and hands it to `mesh-daemon`.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let cli = mesh_daemon::cli::Cli::parse();
    mesh_daemon::run(cli)
}
