//! What the flags ask for, checked and worked out before anything connects:
//! pure functions of the flags, the manifest and the descriptor limit.

use super::Args;
use crate::gen::Manifest;

/// Flags that do not make a run, each with the message `run` exits with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error("every --hds must be a loopback address (the loadgen sends only to this machine)")]
    HdsNotLoopback,
    #[error("--streams-per-connection must be > 0")]
    NoStreamsPerConnection,
    #[error("--flip-fraction must be within 0..=1")]
    FlipFraction,
    #[error("give --dataplanes-dir (from gen-dataplanes) or --count")]
    NoDataplaneSource,
    #[error("no dataplanes")]
    NoDataplanes,
    #[error("--watchers watch hdsd's API: give --api")]
    WatchersWithoutApi,
    #[error(
        "--eds-subscribers subscribe to the services of the dataplane files: give --dataplanes-dir"
    )]
    EdsWithoutDataplanesDir,
    #[error("--churn rewrites dataplane files: give --dataplanes-dir")]
    ChurnWithoutDataplanesDir,
    #[error(
        "{connections} connections need more file descriptors than RLIMIT_NOFILE allows ({nofile}); \
         raise the hard limit or use --streams-per-connection"
    )]
    TooFewDescriptors { connections: usize, nofile: u64 },
}

/// The checks that need nothing but the flags: made before the descriptor
/// limit is raised and the manifest read.
pub fn check_flags(args: &Args) -> Result<(), ArgsError> {
    if args.hds.is_empty() || !args.hds.iter().all(|a| a.ip().is_loopback()) {
        return Err(ArgsError::HdsNotLoopback);
    }
    if args.streams_per_connection == 0 {
        return Err(ArgsError::NoStreamsPerConnection);
    }
    if !(0.0..=1.0).contains(&args.flip_fraction) {
        return Err(ArgsError::FlipFraction);
    }
    Ok(())
}

/// The run the flags and the manifest describe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub count: usize,
    pub mesh: String,
    pub prefix: String,
    /// Clusters every specifier must hold (the manifest's inbounds), when known.
    pub expect_clusters: Option<usize>,
    /// HTTP/2 connections: `count` over `--streams-per-connection`.
    pub connections: usize,
    /// Every how many dataplanes one is timed against the API (0: none).
    pub sample_stride: usize,
}

impl Plan {
    /// The plan, or the first flag that does not fit. `nofile` is the
    /// descriptor limit after raising it.
    pub fn new(args: &Args, manifest: Option<&Manifest>, nofile: u64) -> Result<Plan, ArgsError> {
        let (count, mesh, prefix, expect_clusters) = match (manifest, args.count) {
            (Some(m), _) => (
                m.count,
                m.mesh.clone(),
                m.prefix.clone(),
                Some(usize::from(m.inbounds)),
            ),
            (None, Some(n)) => (n, args.mesh.clone(), args.prefix.clone(), None),
            (None, None) => return Err(ArgsError::NoDataplaneSource),
        };
        if count == 0 {
            return Err(ArgsError::NoDataplanes);
        }
        if args.watchers > 0 && args.api.is_none() {
            return Err(ArgsError::WatchersWithoutApi);
        }
        if args.eds_subscribers > 0 && manifest.is_none() {
            return Err(ArgsError::EdsWithoutDataplanesDir);
        }
        if args.churn > 0 && manifest.is_none() {
            return Err(ArgsError::ChurnWithoutDataplanesDir);
        }
        let connections = count.div_ceil(args.streams_per_connection);
        if (connections as u64) + 64 > nofile {
            return Err(ArgsError::TooFewDescriptors {
                connections,
                nofile,
            });
        }
        Ok(Plan {
            count,
            mesh,
            prefix,
            expect_clusters,
            connections,
            sample_stride: sample_stride(
                count,
                args.sample,
                args.api.is_some(),
                args.rate_unlimited,
            ),
        })
    }

    /// Every dataplane's (mesh, name), in order: the manifest's names, or
    /// `<prefix><index>` with six digits.
    pub fn names(&self, manifest: Option<&Manifest>) -> Vec<(String, String)> {
        (0..self.count)
            .map(|i| {
                let name = match manifest {
                    Some(m) => m.name(i),
                    None => format!("{}{i:06}", self.prefix),
                };
                (self.mesh.clone(), name)
            })
            .collect()
    }
}

/// Every how many dataplanes one is timed against the API: `sample` of
/// `count` spread evenly; 0 (none) without the API, with `--sample 0` and in
/// saturation (no report interval to flip on).
pub fn sample_stride(count: usize, sample: usize, api: bool, rate_unlimited: bool) -> usize {
    if sample == 0 || !api || rate_unlimited {
        0
    } else {
        (count / sample).max(1)
    }
}

/// Whether dataplane `i` is timed: every `stride`-th, the first `sample`.
pub fn sampled(i: usize, stride: usize, sample: usize) -> bool {
    stride > 0 && i.is_multiple_of(stride) && i / stride < sample
}

/// Whether dataplane `i` flips: `fraction` of the fleet, spread evenly
/// (one wherever `i * fraction` crosses a whole number).
pub fn flips(i: usize, fraction: f64) -> bool {
    (i as f64 * fraction).floor() != ((i + 1) as f64 * fraction).floor()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn args(flags: &[&str]) -> Args {
        Cli::try_parse_from(std::iter::once("run").chain(flags.iter().copied()))
            .unwrap_or_else(|e| panic!("{flags:?}: {e}"))
            .args
    }

    fn manifest(count: usize) -> Manifest {
        Manifest {
            count,
            inbounds: 2,
            mesh: "demo".into(),
            prefix: "web-".into(),
            per_file: 10,
            services: 0,
        }
    }

    #[test]
    fn the_defaults_plan_a_count_run() {
        let a = args(&["--count", "1000"]);
        assert_eq!(check_flags(&a), Ok(()));
        let plan = Plan::new(&a, None, 4096).unwrap();
        assert_eq!(
            plan,
            Plan {
                count: 1000,
                mesh: "default".into(),
                prefix: "dp-".into(),
                expect_clusters: None,
                connections: 1000,
                // --sample 50 but no --api: nothing is timed.
                sample_stride: 0,
            }
        );
        assert_eq!(
            plan.names(None)[..2],
            [
                ("default".to_string(), "dp-000000".to_string()),
                ("default".to_string(), "dp-000001".to_string())
            ]
        );
    }

    #[test]
    fn a_manifest_gives_the_names_the_mesh_and_the_clusters() {
        let a = args(&[
            "--count",
            "7",
            "--mesh",
            "other",
            "--streams-per-connection",
            "4",
        ]);
        let m = manifest(10);
        let plan = Plan::new(&a, Some(&m), 4096).unwrap();
        assert_eq!(plan.count, 10, "the manifest's count wins over --count");
        assert_eq!(plan.mesh, "demo");
        assert_eq!(plan.expect_clusters, Some(2));
        assert_eq!(plan.connections, 3);
        assert_eq!(plan.names(Some(&m))[9].1, "web-000009");
    }

    #[test]
    fn flags_that_do_not_make_a_run_are_refused_with_their_message() {
        let refused = |flags: &[&str]| check_flags(&args(flags)).unwrap_err().to_string();
        assert_eq!(
            refused(&["--count", "1", "--hds", "10.0.0.1:5678"]),
            "every --hds must be a loopback address (the loadgen sends only to this machine)"
        );
        assert_eq!(
            refused(&["--count", "1", "--hds", "127.0.0.1:5678,10.0.0.1:5678"]),
            "every --hds must be a loopback address (the loadgen sends only to this machine)"
        );
        assert_eq!(
            refused(&["--count", "1", "--streams-per-connection", "0"]),
            "--streams-per-connection must be > 0"
        );
        assert_eq!(
            refused(&["--count", "1", "--flip-fraction", "1.5"]),
            "--flip-fraction must be within 0..=1"
        );
        assert_eq!(
            refused(&["--count", "1", "--flip-fraction", "NaN"]),
            "--flip-fraction must be within 0..=1"
        );

        let planned = |flags: &[&str], nofile| Plan::new(&args(flags), None, nofile).unwrap_err();
        assert_eq!(planned(&[], 4096), ArgsError::NoDataplaneSource);
        assert_eq!(
            planned(&[], 4096).to_string(),
            "give --dataplanes-dir (from gen-dataplanes) or --count"
        );
        assert_eq!(planned(&["--count", "0"], 4096), ArgsError::NoDataplanes);
        assert_eq!(
            planned(&["--count", "1", "--watchers", "2"], 4096).to_string(),
            "--watchers watch hdsd's API: give --api"
        );
        assert_eq!(
            planned(&["--count", "1", "--eds-subscribers", "2"], 4096).to_string(),
            "--eds-subscribers subscribe to the services of the dataplane files: give --dataplanes-dir"
        );
        assert_eq!(
            planned(&["--count", "1", "--churn", "5"], 4096).to_string(),
            "--churn rewrites dataplane files: give --dataplanes-dir"
        );
        // 1000 connections and 64 spare descriptors do not fit in 1063.
        assert_eq!(
            planned(&["--count", "1000"], 1063).to_string(),
            "1000 connections need more file descriptors than RLIMIT_NOFILE allows (1063); \
             raise the hard limit or use --streams-per-connection"
        );
        assert!(Plan::new(&args(&["--count", "1000"]), None, 1064).is_ok());
    }

    #[test]
    fn flags_clap_cannot_read_are_named() {
        let err = |flags: &[&str]| {
            Cli::try_parse_from(std::iter::once("run").chain(flags.iter().copied()))
                .err()
                .unwrap_or_else(|| panic!("{flags:?} parsed"))
                .to_string()
        };
        let e = err(&["--duration", "soon"]);
        assert!(e.contains("invalid value 'soon' for '--duration"), "{e}");
        let e = err(&["--token-file", "t", "--sign-with-state-dir", "s"]);
        assert!(e.contains("cannot be used with"), "{e}");
        // --saturation is the old name of --rate-unlimited.
        assert!(args(&["--saturation"]).rate_unlimited);
        assert_eq!(
            args(&["--warmup", "1500ms"]).warmup,
            Some(std::time::Duration::from_millis(1500))
        );
    }

    #[test]
    fn the_sample_is_spread_over_the_fleet() {
        assert_eq!(sample_stride(1000, 50, true, false), 20);
        assert_eq!(sample_stride(10, 50, true, false), 1);
        assert_eq!(sample_stride(1000, 0, true, false), 0);
        assert_eq!(sample_stride(1000, 50, false, false), 0);
        assert_eq!(sample_stride(1000, 50, true, true), 0);
        let timed: Vec<usize> = (0..1000).filter(|&i| sampled(i, 20, 50)).collect();
        assert_eq!(timed.len(), 50);
        assert_eq!((timed[0], timed[1], timed[49]), (0, 20, 980));
        // 10 dataplanes, 50 asked for: every one, no more.
        assert_eq!((0..10).filter(|&i| sampled(i, 1, 50)).count(), 10);
        assert!(!sampled(0, 0, 50));
    }

    #[test]
    fn the_flipping_fraction_is_spread_evenly() {
        let flipping: Vec<usize> = (0..10).filter(|&i| flips(i, 0.2)).collect();
        assert_eq!(flipping, [4, 9]);
        assert_eq!((0..1000).filter(|&i| flips(i, 0.25)).count(), 250);
        assert_eq!((0..100).filter(|&i| flips(i, 0.0)).count(), 0);
        assert_eq!((0..100).filter(|&i| flips(i, 1.0)).count(), 100);
    }
}
