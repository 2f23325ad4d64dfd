//! The `hdsd` command line.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use hdsd::bootstrap::{bootstrap_yaml, BootstrapParams};
use hdsd::clock::{Clock as _, SystemClock};
use hdsd::config::{Config, LogFormat, DEFAULTS_TOML};
use hdsd::dataplane::DataplaneId;
use hdsd::server;
use hdsd::source::{self, Loaded};

/// jemalloc instead of glibc's malloc. glibc spent 17 % of hdsd's CPU in a
/// reconnect storm at 10k Envoys in `_int_malloc`, `unlink_chunk` and
/// `malloc_consolidate`, carving each connection's HTTP/2 buffers (16, 8 and
/// 4 KiB) out of a fragmented heap; jemalloc spends 8 %. Connecting 10k
/// Envoys costs about a third less CPU, and the steady RSS is 3 % lower
/// (BENCHMARKS.md, "Round six"). mimalloc held a third more memory.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "hdsd",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("BUILD_GIT_COMMIT"), ")"),
    about = "A management server for Envoy's Health Discovery Service"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// How the CLI reaches a running hdsd's REST API.
#[derive(clap::Args)]
struct ApiArgs {
    /// hdsd's REST API (https://... when it has api.tls).
    #[arg(long, default_value = "http://127.0.0.1:5680")]
    api: String,
    /// One of the server's api.tokens, when its API requires one.
    #[arg(long)]
    api_token: Option<String>,
    /// CA certificate (PEM) that signed the API's TLS certificate (api.tls).
    #[arg(long)]
    ca: Option<PathBuf>,
}

#[derive(Subcommand)]
// Parsed once per process: the size of its largest variant does not matter.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Run the server.
    Serve {
        /// Config file (.toml, .yaml or .yml); HDSD_* variables override it.
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Check the config and every dataplane file; exit 1 listing every problem.
    Validate {
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Dataplane tokens: create keys, issue, inspect and revoke tokens.
    Token {
        /// Config file; tokens use its state_dir and auth settings.
        #[arg(long, short, global = true)]
        config: Option<PathBuf>,
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Configuration helpers.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Print the readiness table from a running hdsd.
    Status {
        #[command(flatten)]
        api: ApiArgs,
        /// Refresh the table in place every second.
        #[arg(long)]
        watch: bool,
        /// Only dataplanes of this mesh.
        #[arg(long)]
        mesh: Option<String>,
        /// Only dataplanes with an inbound of this `kuma.io/service`.
        #[arg(long)]
        service: Option<String>,
        /// On a global: only this zone's dataplanes (`local`: the global's own).
        #[arg(long)]
        zone: Option<String>,
        /// Only dataplanes with an inbound that is not ready.
        #[arg(long)]
        not_ready: bool,
        /// Only dataplanes with an inbound in one of these statuses
        /// (`unhealthy`, `timeout`, `stale`, ...; repeat or separate with commas).
        #[arg(long, value_delimiter = ',')]
        status: Vec<String>,
        /// Print the dataplanes (and the zones) as JSON instead of a table.
        #[arg(long, conflicts_with = "watch")]
        json: bool,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) of hdsd and its commands.
    Man,
    /// Explain one dataplane: for each inbound what is checked, by which
    /// Envoy, the last reports, and why it is not ready.
    Explain {
        /// The dataplane's mesh.
        mesh: String,
        /// The dataplane's name.
        name: String,
        /// On a global: the zone the dataplane belongs to.
        #[arg(long)]
        zone: Option<String>,
        #[command(flatten)]
        api: ApiArgs,
        /// Print the dataplane's API item as JSON instead.
        #[arg(long)]
        json: bool,
    },
    /// Follow readiness changes from a running hdsd: one line per change.
    Watch {
        #[command(flatten)]
        api: ApiArgs,
        /// Only dataplanes of this mesh.
        #[arg(long)]
        mesh: Option<String>,
        /// Only dataplanes with an inbound carrying this tag (repeatable): k=v.
        #[arg(long = "selector", value_parser = parse_tag)]
        selector: Vec<(String, String)>,
        /// On a global: only this zone's dataplanes (`local`: the global's own).
        #[arg(long)]
        zone: Option<String>,
        /// Only changes of dataplanes with an inbound not ready (before or
        /// after the change, so that recoveries show too); zone lines always.
        #[arg(long)]
        not_ready: bool,
        /// One JSON object per line instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Send Dataplane definitions to a running hdsd (dataplanes.source = "api"), like `kumactl apply`.
    Apply {
        /// A file (YAML documents separated by ---, or JSON), or a directory of them.
        #[arg(long, short = 'f')]
        file: PathBuf,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Delete a dataplane's definition from a running hdsd (dataplanes.source = "api").
    Delete {
        mesh: String,
        name: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// A global's zones, through its REST API: register, delete, disable, enable
    /// (no restart of the global).
    Zone {
        /// The global's REST API (https://... when it has api.tls).
        #[arg(long, default_value = "http://127.0.0.1:5680", global = true)]
        api: String,
        /// One of the global's api.tokens, when its API requires one.
        #[arg(long, global = true)]
        api_token: Option<String>,
        /// CA certificate (PEM) that signed the API's TLS certificate (api.tls).
        #[arg(long, global = true)]
        ca: Option<PathBuf>,
        #[command(subcommand)]
        command: ZoneCommand,
    },
    /// Print an Envoy bootstrap that connects a dataplane to hdsd
    /// (`bootstrap front`: a front proxy routing by readiness).
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Bootstrap {
        #[command(subcommand)]
        front: Option<BootstrapCommand>,
        #[arg(long, required = true)]
        mesh: Option<String>,
        #[arg(long, required = true)]
        name: Option<String>,
        /// hdsd's HDS address, HOST:PORT; repeat it for each instance of a
        /// cluster (Envoy reconnects to another when one fails).
        #[arg(long, default_value = "127.0.0.1:5678")]
        server: Vec<String>,
        /// File holding the dataplane token.
        #[arg(long, conflicts_with = "token")]
        token_file: Option<PathBuf>,
        /// The dataplane token.
        #[arg(long)]
        token: Option<String>,
        /// Envoy's admin port (bound on 127.0.0.1).
        #[arg(long, default_value_t = 9901)]
        admin_port: u16,
        /// CA certificate to verify hdsd's TLS certificate (turns TLS on).
        #[arg(long)]
        ca: Option<PathBuf>,
        /// Write to this file instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum ZoneCommand {
    /// Register a zone at a running global: from then on it may connect
    /// (with a zone token from `hdsd token issue --zone NAME`).
    Add {
        /// The zone's name (a DNS-1123 label).
        name: String,
        /// Register it disabled: its streams are refused until `hdsd zone enable`.
        #[arg(long)]
        disabled: bool,
    },
    /// Delete a zone: its stream ends, its dataplanes leave the global's
    /// view, its series and stored rows go, and its zone tokens issued until
    /// now stay refused (also if it is added again).
    Delete { name: String },
    /// Disable a zone: its stream ends and is refused, its data withdrawn.
    Disable { name: String },
    /// Enable a disabled zone: it connects again at its next try.
    Enable { name: String },
}

#[derive(Subcommand)]
enum BootstrapCommand {
    /// An HTTP front proxy routing to one service's EDS cluster, fed by hdsd:
    /// endpoints leave it when their checks fail.
    Front {
        /// The service (inbound tag kuma.io/service) to route to.
        #[arg(long)]
        service: String,
        #[arg(long, default_value = "default")]
        mesh: String,
        /// The front's HTTP listener (port 0: any free port).
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: std::net::SocketAddr,
        /// hdsd's HDS address (EDS is served there), HOST:PORT.
        #[arg(long, default_value = "127.0.0.1:5678")]
        server: String,
        /// File holding one of hdsd's api.tokens or eds.tokens (needed with auth.mode = "token").
        #[arg(long, conflicts_with = "token")]
        token_file: Option<PathBuf>,
        /// One of hdsd's api.tokens or eds.tokens.
        #[arg(long)]
        token: Option<String>,
        /// Envoy's admin port (bound on 127.0.0.1; 0: any free port).
        #[arg(long, default_value_t = 9901)]
        admin_port: u16,
        /// CA certificate to verify hdsd's TLS certificate (turns TLS on).
        #[arg(long)]
        ca: Option<PathBuf>,
        /// The front's zone (node.locality.zone): a global serves its own
        /// zone's endpoints first and fails over to the other zones.
        #[arg(long)]
        zone: Option<String>,
        /// Write to this file instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn read_token(
    token_file: Option<PathBuf>,
    token: Option<String>,
) -> anyhow::Result<Option<String>> {
    Ok(match token_file {
        Some(path) => Some(
            std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read --token-file {}", path.display()))?
                .trim()
                .to_string(),
        ),
        None => token,
    })
}

fn write_out(out: Option<PathBuf>, yaml: &str) -> anyhow::Result<()> {
    match out {
        Some(path) => {
            std::fs::write(&path, yaml).with_context(|| format!("cannot write {}", path.display()))
        }
        None => {
            print!("{yaml}");
            Ok(())
        }
    }
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a new signing key pair under <state_dir>/keys (never overwrites).
    Keygen,
    /// Print a token for one dataplane, signed with the newest key.
    /// A dataplane token (`--mesh M --name N`), or a zone token for the
    /// global's zone listener (`--zone Z --mesh M [--mesh M2 ...]`: the
    /// meshes whose dataplanes the zone may announce).
    Issue {
        /// The dataplane's mesh; with --zone, a mesh the zone may announce (repeatable).
        #[arg(long, required = true)]
        mesh: Vec<String>,
        /// The dataplane's name (not with --zone).
        #[arg(long, conflicts_with = "zone", required_unless_present = "zone")]
        name: Option<String>,
        /// Issue a zone token for this zone (a DNS-1123 label).
        #[arg(long)]
        zone: Option<String>,
        /// How long the token is valid (at most auth.max_token_validity).
        #[arg(long, default_value = "720h", value_parser = humantime::parse_duration)]
        valid_for: Duration,
        /// A tag the dataplane must carry on one of its inbounds (repeatable): k=v.
        #[arg(long = "tag", value_parser = parse_tag)]
        tags: Vec<(String, String)>,
    },
    /// Print a token's claims and whether this server would accept it.
    Inspect { token: String },
    /// Revoke a token by its id (jti); running servers end its streams within a second.
    Revoke { jti: String },
}

fn parse_tag(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("tag {s:?} is not key=value")),
    }
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the complete default configuration, with a comment per key.
    Defaults,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve { config } => serve(config.as_deref()),
        Command::Validate { config } => validate(config.as_deref()),
        Command::Config {
            command: ConfigCommand::Defaults,
        } => {
            print!("{DEFAULTS_TOML}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Status {
            api: ApiArgs { api, api_token, ca },
            watch,
            mesh,
            service,
            zone,
            not_ready,
            status: statuses,
            json,
        } => status(
            &api,
            watch,
            api_token.as_deref(),
            ca.as_deref(),
            &hdsd::status::Filter {
                mesh,
                service,
                zone,
                not_ready,
                status: statuses,
            },
            json,
        ),
        Command::Completions { shell } => {
            use clap::CommandFactory as _;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "hdsd", &mut script);
            std::io::stdout().write_all(&script)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            use clap::CommandFactory as _;
            let command = Cli::command();
            let mut out = Vec::new();
            clap_mangen::Man::new(command.clone()).render(&mut out)?;
            // One section per command, as `hdsd help COMMAND` shows it.
            for sub in command.get_subcommands() {
                let name = format!("hdsd-{}", sub.get_name());
                let sub = sub.clone().display_name(name);
                writeln!(out)?;
                clap_mangen::Man::new(sub).render(&mut out)?;
            }
            std::io::stdout().write_all(&out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Explain {
            mesh,
            name,
            zone,
            api: ApiArgs { api, api_token, ca },
            json,
        } => {
            let agent = hdsd::client::agent(ca.as_deref())?;
            let path = hdsd::status::dataplane_path(&mesh, &name, zone.as_deref());
            let item: hdsd::view::DataplaneItem =
                hdsd::client::get_json(&agent, &api, &path, api_token.as_deref())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&item)?);
            } else {
                print!("{}", hdsd::status::render_explain(&item, SystemClock.now()));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Watch {
            api: ApiArgs { api, api_token, ca },
            mesh,
            selector,
            zone,
            not_ready,
            json,
        } => {
            let agent = hdsd::client::agent(ca.as_deref())?;
            hdsd::client::watch(
                &agent,
                &hdsd::client::WatchOptions {
                    api,
                    token: api_token,
                    mesh,
                    selector,
                    zone,
                    not_ready,
                    json,
                },
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Token { config, command } => token(config.as_deref(), command),
        Command::Apply {
            file,
            api: ApiArgs { api, api_token, ca },
        } => {
            let agent = hdsd::client::agent(ca.as_deref())?;
            let target = hdsd::apply::Target {
                agent: &agent,
                api: &api,
                token: api_token.as_deref(),
            };
            let applied = hdsd::apply::apply(&target, &file).map_err(anyhow::Error::msg)?;
            for line in &applied.lines {
                println!("{line}");
            }
            for problem in &applied.problems {
                eprintln!("{problem}");
            }
            if applied.problems.is_empty() {
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("{} document(s) not applied", applied.problems.len());
                Ok(ExitCode::from(1))
            }
        }
        Command::Delete {
            mesh,
            name,
            api: ApiArgs { api, api_token, ca },
        } => {
            let id = DataplaneId::try_new(&mesh, &name).map_err(|e| {
                anyhow::anyhow!("{mesh:?} {name:?} is not a dataplane identity: {e}")
            })?;
            let agent = hdsd::client::agent(ca.as_deref())?;
            let target = hdsd::apply::Target {
                agent: &agent,
                api: &api,
                token: api_token.as_deref(),
            };
            hdsd::apply::delete(&target, &id)
                .map_err(|e| anyhow::anyhow!("dataplane {id} not deleted: {e}"))?;
            println!("dataplane {id} deleted");
            Ok(ExitCode::SUCCESS)
        }
        Command::Zone {
            api,
            api_token,
            ca,
            command,
        } => {
            use hdsd::zone_client::ZoneCommand as Z;
            let (command, name) = match command {
                ZoneCommand::Add { name, disabled } => (Z::Add { disabled }, name),
                ZoneCommand::Delete { name } => (Z::Delete, name),
                ZoneCommand::Disable { name } => (Z::Disable, name),
                ZoneCommand::Enable { name } => (Z::Enable, name),
            };
            let agent = hdsd::client::agent(ca.as_deref())?;
            let target = hdsd::apply::Target {
                agent: &agent,
                api: &api,
                token: api_token.as_deref(),
            };
            let line = hdsd::zone_client::run(&target, command, &name)
                .map_err(|e| anyhow::anyhow!("zone {name} not changed: {e}"))?;
            println!("{line}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Bootstrap {
            front:
                Some(BootstrapCommand::Front {
                    service,
                    mesh,
                    listen,
                    server,
                    token_file,
                    token,
                    admin_port,
                    ca,
                    zone,
                    out,
                }),
            ..
        } => {
            let yaml = hdsd::bootstrap::front_yaml(&hdsd::bootstrap::FrontParams {
                mesh,
                service,
                listen,
                server,
                token: read_token(token_file, token)?,
                admin_port,
                ca,
                zone,
            })?;
            write_out(out, &yaml)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bootstrap {
            front: None,
            mesh,
            name,
            server,
            token_file,
            token,
            admin_port,
            ca,
            out,
        } => {
            let (mesh, name) = (mesh.unwrap_or_default(), name.unwrap_or_default());
            let token = read_token(token_file, token)?;
            let id = DataplaneId::try_new(&mesh, &name).map_err(|e| {
                anyhow::anyhow!(
                    "--mesh {mesh:?} --name {name:?} is not a dataplane identity: {e}; the mesh takes lowercase letters, digits and '-', and the name must not be empty"
                )
            })?;
            let yaml = bootstrap_yaml(&BootstrapParams {
                id,
                servers: server,
                token,
                admin_port,
                ca,
            })?;
            write_out(out, &yaml)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn init_logging(config: &Config) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let json = config.log.format == LogFormat::Json;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(hdsd::logging::BudgetedStderr::new(
            config.log.max_bytes_per_second,
            json,
        ));
    match config.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn serve(config_path: Option<&Path>) -> anyhow::Result<ExitCode> {
    let config = Config::load(config_path)?;
    init_logging(&config);
    for warning in config.secret_file_warnings(config_path) {
        tracing::warn!("{warning}");
    }
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    match runtime
        .block_on(server::run(config, shutdown_signal()))
        .map_err(|e| match e {
            server::ServeError::Config(problems) => {
                server::ServeError::Config(Config::locate(problems, config_path))
            }
            e => e,
        }) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            // Logging is set up by now: the log (stderr) carries the message once.
            tracing::error!("{e}");
            Ok(ExitCode::from(e.exit_code()))
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot listen for SIGTERM: {e}");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        _ = term.recv() => tracing::info!("SIGTERM received"),
    }
}

fn validate(config_path: Option<&Path>) -> anyhow::Result<ExitCode> {
    let config = Config::load(config_path)?;
    let mut problems = config.validate();
    problems.extend(config.file_problems());
    let mut problems = Config::locate(problems, config_path);
    let settings = hdsd::specifier::SpecifierSettings::from(&config);
    let mut dataplanes = 0;
    let mut ignored = String::new();
    let from_api = config.dataplanes.source == hdsd::config::DataplanesSource::Api;
    if problems.is_empty() && from_api {
        println!(
            "ok: configuration valid; dataplanes.source is \"api\": definitions come from the {} store, checked when they are applied",
            match config.store.kind {
                hdsd::config::StoreKind::Redb => "redb",
                hdsd::config::StoreKind::Postgres => "PostgreSQL",
            }
        );
        return Ok(ExitCode::SUCCESS);
    }
    if problems.is_empty() {
        match source::load(
            &config.dataplanes.dir,
            &Loaded::default(),
            &settings,
            &config.dataplanes.limits(),
        ) {
            Ok(loaded) => {
                dataplanes = loaded.dataplanes.len();
                problems.extend(loaded.problems());
                ignored = ignored_summary(&loaded);
                for w in loaded.warnings() {
                    eprintln!("{w}");
                }
                for w in version_warnings(&loaded, &config) {
                    eprintln!("{w}");
                }
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    if !ignored.is_empty() {
        // Beside the problems on stderr when there are any.
        if problems.is_empty() {
            println!("{ignored}");
        } else {
            eprintln!("{ignored}");
        }
    }
    if problems.is_empty() {
        println!(
            "ok: configuration valid, {dataplanes} dataplanes in {}",
            config.dataplanes.dir.display()
        );
        let detection = settings
            .defaults
            .worst_case_detection(config.hds.report_interval);
        println!(
            "worst-case detection with the check defaults: {} (unhealthy_threshold x no_traffic_interval + timeout + report_interval)",
            humantime::format_duration(detection)
        );
        return Ok(ExitCode::SUCCESS);
    }
    for p in &problems {
        eprintln!("{p}");
    }
    eprintln!("{} problem(s) found", problems.len());
    Ok(ExitCode::from(1))
}

/// A warning for each probe that an Envoy older than its kind needs but
/// still supported (docs/configuration.md, "Envoy versions") cannot run.
fn version_warnings(loaded: &Loaded, config: &Config) -> Vec<String> {
    let fallback = match config.hds.check.fallback {
        hdsd::config::CheckFallback::Tcp => "it is checked with a TCP connect instead (hds.check.fallback)",
        hdsd::config::CheckFallback::None => "its inbounds read unsupported there (not ready); set hds.check.fallback = \"tcp\" to check them with a TCP connect instead",
    };
    let mut warnings = Vec::new();
    for (id, defined) in loaded.dataplanes.iter() {
        for (target, r) in defined.specifier.beyond_oldest_supported() {
            let ports: Vec<String> = target
                .inbounds
                .iter()
                .filter_map(|&i| defined.dataplane.inbounds.get(i))
                .map(|i| i.port.to_string())
                .collect();
            warnings.push(format!(
                "warning: {id} inbound {} ({}): {} needs Envoy >= {}.{}, and hdsd supports Envoy from {}.{}: on an older Envoy {fallback}",
                ports.join(", "),
                defined.file.display(),
                r.what,
                r.since.major,
                r.since.minor,
                hdsd::capability::OLDEST_SUPPORTED.major,
                hdsd::capability::OLDEST_SUPPORTED.minor,
            ));
        }
    }
    warnings
}

/// `ignored N documents that are not Dataplanes (Mesh: 1, ...)`, or nothing.
fn ignored_summary(loaded: &Loaded) -> String {
    let by_type = loaded.ignored_by_type();
    let total: usize = by_type.values().sum();
    if total == 0 {
        return String::new();
    }
    let kinds: Vec<String> = by_type.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    let what = if total == 1 {
        "document that is not a Dataplane"
    } else {
        "documents that are not Dataplanes"
    };
    format!(
        "ignored {total} {what} ({}); GET /api/v1/sources lists them per file",
        kinds.join(", ")
    )
}

fn status(
    api: &str,
    watch: bool,
    api_token: Option<&str>,
    ca: Option<&Path>,
    filter: &hdsd::status::Filter,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let agent = hdsd::client::agent(ca)?;
    // An hdsd without zones, or one older than them, answers 404 or an
    // empty list: the status has no zones part then.
    let zones = || -> hdsd::status::ZonesAnswer {
        hdsd::client::get_json(&agent, api, "/api/v1/zones", api_token).unwrap_or_default()
    };
    // Definitions through the API have no files: nothing to list then.
    let sources = || -> Option<hdsd::api::SourcesView> {
        hdsd::client::get_json(&agent, api, "/api/v1/sources", api_token).ok()
    };
    // Every page the server gives for the filters.
    let list = || -> Result<Vec<hdsd::view::DataplaneItem>, hdsd::client::ClientError> {
        hdsd::client::list_all(&agent, api, &filter.path(), api_token)
    };
    if json {
        let files = sources().map(|s| s.files).unwrap_or_default();
        let warned: Vec<_> = files
            .iter()
            .filter(|f| !f.warnings.is_empty())
            .map(|f| serde_json::json!({ "path": f.path, "warnings": f.warnings }))
            .collect();
        let broken: Vec<_> = files.into_iter().filter(|f| f.error.is_some()).collect();
        let out = serde_json::json!({
            "items": list()?,
            "zones": zones(),
            "brokenFiles": broken,
            "fileWarnings": warned,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    if !watch {
        print!(
            "{}",
            hdsd::status::render_now(&list()?, sources().as_ref(), &zones())
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut stdout = std::io::stdout();
    loop {
        let screen = match list() {
            Ok(items) => hdsd::status::render_now(&items, sources().as_ref(), &zones()),
            Err(e) => format!("{e}\n"),
        };
        // Home the cursor and clear the screen, then draw: refresh in place.
        write!(stdout, "\x1b[H\x1b[2J{screen}")?;
        stdout.flush()?;
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn token(config_path: Option<&Path>, command: TokenCommand) -> anyhow::Result<ExitCode> {
    use hdsd::auth::{inspect, KeyRing, Revocations};
    let config = Config::load(config_path)?;
    let now = SystemClock.now();
    let state_dir = &config.state_dir;
    let revocations = config.auth.revocations_path(state_dir);
    match command {
        TokenCommand::Keygen => {
            let key = KeyRing::generate(state_dir, now)?;
            println!("created key {}", key.kid);
            println!(
                "  private: {} (keep it secret; mode 0600)",
                key.private_path.display()
            );
            println!("  public:  {}", key.public_path.display());
            println!("new tokens are signed with it; tokens of older keys stay valid until their key files are removed");
        }
        TokenCommand::Issue {
            mesh,
            name,
            zone,
            valid_for,
            tags,
        } => {
            let ring = KeyRing::load(state_dir, &config.auth.public_keys)?;
            let token = match (zone, name) {
                (Some(zone), _) => {
                    if !tags.is_empty() {
                        anyhow::bail!("--tag is for dataplane tokens; a zone token carries --zone and the --mesh(es) it may announce");
                    }
                    ring.issue_zone(&zone, &mesh, valid_for, config.auth.max_token_validity, now)?
                }
                (None, Some(name)) => {
                    let [mesh] = &mesh[..] else {
                        anyhow::bail!("a dataplane token names one --mesh (got {}); more than one is for zone tokens (--zone)", mesh.len());
                    };
                    ring.issue(
                        mesh,
                        &name,
                        valid_for,
                        config.auth.max_token_validity,
                        tags.into_iter().collect(),
                        now,
                    )?
                }
                (None, None) => {
                    anyhow::bail!("name the dataplane with --name, or the zone with --zone")
                }
            };
            println!("{token}");
            // On stderr: the token alone on stdout can be piped to a file.
            let expires = now + chrono::Duration::from_std(valid_for).unwrap_or_default();
            eprintln!(
                "expires at {} (valid for {}); issue the next one before then: the old one stays valid until it expires",
                expires.to_rfc3339(),
                humantime::format_duration(valid_for)
            );
        }
        TokenCommand::Inspect { token } => {
            let ring = KeyRing::load(state_dir, &config.auth.public_keys)?;
            let revoked = Revocations::load(&revocations)?;
            let inspection = inspect(&ring, &revoked, token.trim(), now);
            println!("{inspection}");
            if !inspection.accepted() {
                return Ok(ExitCode::from(1));
            }
        }
        TokenCommand::Revoke { jti } => {
            if config.store.kind == hdsd::config::StoreKind::Postgres {
                // Every instance sharing the store takes it from there.
                Revocations::revoke(&revocations, &jti)?;
                let runtime =
                    tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
                let added = runtime.block_on(async {
                    let store =
                        hdsd::store::postgres::PgStore::connect(&config.store.postgres).await?;
                    store.revoke(&jti).await
                })?;
                println!(
                    "{} {jti} in the PostgreSQL store (and {}); every instance sharing it ends its streams within a second",
                    if added { "revoked" } else { "already revoked:" },
                    revocations.display()
                );
                return Ok(ExitCode::SUCCESS);
            }
            if Revocations::revoke(&revocations, &jti)? {
                println!(
                    "revoked {jti} (in {}); running hdsd servers end its streams within a second",
                    revocations.display()
                );
            } else {
                println!("{jti} was already revoked");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
