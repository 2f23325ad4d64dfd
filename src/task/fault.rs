//! Faults a test injects into a running hdsd, behind the cargo feature
//! `fault-injection`: off by default and in every release build, where
//! nothing here reads the environment and no fault exists.
//!
//! The integration tests run the real binary, which `cfg(test)` never
//! reaches; `make test` builds it with the feature. `HDSD_FAULT` names one
//! fault:
//! - `<task>:return` or `<task>:panic`, for the supervised tasks `feed` and
//!   `registry`: the task returns or panics when hdsd receives SIGUSR2, so
//!   a test first sees hdsd ready, then the failure;
//! - `dataplane-panic:<mesh>/<name>`: that dataplane's task panics as it
//!   starts (the registry contains it).

use std::future::Future;

use super::Task;

/// What a faulted supervised task does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Return,
    Panic,
}

/// The fault `spec` (the value of `HDSD_FAULT`) sets for the supervised
/// task `task`, if any.
pub fn parse_task(spec: &str, task: &str) -> Option<Fault> {
    let (site, what) = spec.trim().split_once(':')?;
    if site != task {
        return None;
    }
    match what {
        "return" => Some(Fault::Return),
        "panic" => Some(Fault::Panic),
        _ => None,
    }
}

/// Whether `spec` makes the task of dataplane `id` (`mesh/name`) panic.
pub fn parse_dataplane(spec: &str, id: &str) -> bool {
    spec.trim()
        .strip_prefix("dataplane-panic:")
        .is_some_and(|d| d == id)
}

/// `HDSD_FAULT`, read once; always `None` without the feature.
fn spec() -> Option<&'static str> {
    #[cfg(feature = "fault-injection")]
    {
        static SPEC: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        SPEC.get_or_init(|| std::env::var("HDSD_FAULT").ok())
            .as_deref()
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        None
    }
}

/// Whether the task of dataplane `mesh`/`name` is to panic.
pub fn dataplane_panics(mesh: &str, name: &str) -> bool {
    spec().is_some_and(|s| parse_dataplane(s, &format!("{mesh}/{name}")))
}

/// The supervised task `name`, with its fault when one is set for it.
pub fn inject(name: &str, task: impl Future<Output = ()> + Send + 'static) -> Task {
    match spec().and_then(|s| parse_task(s, name)) {
        None => Box::pin(task),
        Some(fault) => faulted(name.to_string(), fault, task),
    }
}

#[cfg(feature = "fault-injection")]
fn faulted(name: String, fault: Fault, task: impl Future<Output = ()> + Send + 'static) -> Task {
    use tokio::signal::unix::{signal, SignalKind};
    // Installed now, before hdsd reads ready: a SIGUSR2 sent after that
    // is never the default action (which ends the process).
    let mut usr2 = signal(SignalKind::user_defined2()).ok();
    Box::pin(async move {
        let fire = async {
            match usr2.as_mut() {
                Some(usr2) => {
                    usr2.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = task => {}
            () = fire => {
                tracing::warn!(task = %name, ?fault, "fault injected (HDSD_FAULT)");
                if fault == Fault::Panic {
                    panic!("fault injected into the {name} task (HDSD_FAULT)");
                }
            }
        }
    })
}

#[cfg(not(feature = "fault-injection"))]
fn faulted(_: String, _: Fault, task: impl Future<Output = ()> + Send + 'static) -> Task {
    Box::pin(task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_fault_names_its_task_and_what_it_does() {
        assert_eq!(parse_task("feed:return", "feed"), Some(Fault::Return));
        assert_eq!(parse_task("feed:panic", "feed"), Some(Fault::Panic));
        assert_eq!(parse_task("feed:panic", "registry"), None);
        assert_eq!(parse_task("feed:explode", "feed"), None);
        assert_eq!(parse_task("feed", "feed"), None);
    }

    #[test]
    fn a_dataplane_fault_names_one_dataplane() {
        assert!(parse_dataplane(
            "dataplane-panic:default/web-1",
            "default/web-1"
        ));
        assert!(!parse_dataplane(
            "dataplane-panic:default/web-1",
            "default/web-2"
        ));
        assert!(!parse_dataplane("feed:panic", "default/web-1"));
    }
}
