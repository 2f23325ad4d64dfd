//! `hdsd completions SHELL`: the shell completion script of the whole
//! command tree.

use std::io::Write as _;
use std::process::ExitCode;

use clap::CommandFactory as _;

/// `hdsd completions`' arguments.
#[derive(clap::Args)]
pub(super) struct CompletionsArgs {
    /// The shell.
    shell: clap_complete::Shell,
}

impl CompletionsArgs {
    pub(super) fn run(self) -> anyhow::Result<ExitCode> {
        std::io::stdout().write_all(&script(self.shell))?;
        Ok(ExitCode::SUCCESS)
    }
}

fn script(shell: clap_complete::Shell) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut super::Cli::command(), "hdsd", &mut script);
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_completes_every_command() {
        let bash = String::from_utf8(script(clap_complete::Shell::Bash)).unwrap();
        for command in [
            "serve",
            "validate",
            "status",
            "explain",
            "zone",
            "bootstrap",
        ] {
            assert!(bash.contains(command), "{command}");
        }
        assert!(bash.contains("--api-token"));
    }
}
