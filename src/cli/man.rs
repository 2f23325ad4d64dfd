//! `hdsd man`: the man page (roff) of hdsd, then one section per command,
//! as `hdsd help COMMAND` shows it.

use std::io::Write as _;
use std::process::ExitCode;

use clap::CommandFactory as _;

/// `hdsd man`'s arguments (none).
#[derive(clap::Args)]
pub(super) struct ManArgs {}

impl ManArgs {
    pub(super) fn run(self) -> anyhow::Result<ExitCode> {
        std::io::stdout().write_all(&page()?)?;
        Ok(ExitCode::SUCCESS)
    }
}

fn page() -> std::io::Result<Vec<u8>> {
    let command = super::Cli::command();
    let mut out = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut out)?;
    for sub in command.get_subcommands() {
        let name = format!("hdsd-{}", sub.get_name());
        let sub = sub.clone().display_name(name);
        writeln!(out)?;
        clap_mangen::Man::new(sub).render(&mut out)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_has_a_section_per_command() {
        let page = String::from_utf8(page().unwrap()).unwrap();
        assert!(page.starts_with(".ie"), "{}", &page[..40]);
        for command in ["hdsd-serve", "hdsd-validate", "hdsd-zone", "hdsd-bootstrap"] {
            assert!(page.contains(&format!(".TH {command}")), "{command}");
        }
    }
}
