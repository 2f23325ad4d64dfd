//! `hdsd config defaults`: configuration helpers (today one: the complete
//! default configuration, with a comment per key).

use std::process::ExitCode;

use clap::Subcommand;

/// `hdsd config`'s arguments.
#[derive(clap::Args)]
pub(super) struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the complete default configuration, with a comment per key.
    Defaults,
}

impl ConfigArgs {
    pub(super) fn run(self) -> anyhow::Result<ExitCode> {
        match self.command {
            ConfigCommand::Defaults => print!("{}", crate::config::DEFAULTS_TOML),
        }
        Ok(ExitCode::SUCCESS)
    }
}
