//! Network namespaces for partition tests: [`Netns::create`] makes a
//! namespace joined to this one by a veth pair on a /24 of 198.18.0.0/15
//! (the benchmarking range, RFC 2544: on no real network), the host's end
//! `198.18.N.1`, the namespace's ends `198.18.N.2` and up. [`Netns::cut`]
//! silently drops one address's TCP port with `iptables` rules *inside the
//! namespace* (DROP, no RST: the peers' connections stay established and
//! their packets vanish, as behind a dead route), and the returned [`Cut`]
//! heals it when asked or dropped.
//!
//! Nothing of the host's own configuration is touched beyond the veth end
//! this creates (and its address and connected route, which go with it):
//! the firewall rules live in the namespace. Everything is removed when
//! dropped, also when a test panics. Names are unique per process and test.
//!
//! Without root or `ip netns`, [`Netns::create`] prints one `SKIPPED` line
//! naming what is missing and returns `None`.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

fn run(what: &str, command: &mut Command) -> Result<(), String> {
    let out = command.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    run(
        &format!("ip {}", args.join(" ")),
        Command::new("ip").args(args),
    )
}

/// A network namespace with one veth link to this one.
pub struct Netns {
    pub name: String,
    host_veth: String,
    subnet: u8,
}

impl Netns {
    /// A namespace with `addresses` addresses on its end of the link, or
    /// `None` (with a `SKIPPED` line) when this process cannot make one.
    pub fn create(test: &str, addresses: u8) -> Option<Netns> {
        let uid = Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        if uid != "0" {
            crate::support::skip(format!("SKIPPED {test}: making network namespaces and firewall rules needs root (uid {uid:?}); run the test as root"
            ));
            return None;
        }
        for tool in ["ip", "iptables"] {
            if Command::new(tool).arg("-V").output().is_err() {
                crate::support::skip(format!(
                    "SKIPPED {test}: `{tool}` is not installed (iptables, iproute2)"
                ));
                return None;
            }
        }
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let taken = Command::new("ip")
            .args(["-4", "-o", "addr", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let subnet = (0..250u32)
            .map(|i| ((pid.wrapping_mul(7) + k * 13 + i) % 250 + 1) as u8)
            .find(|n| !taken.contains(&format!("198.18.{n}.")))
            .expect("a free 198.18.N.0/24");
        let netns = Netns {
            name: format!("hdsd-{pid}-{k}"),
            host_veth: format!("hdsd{}h{k}", pid % 100_000),
            subnet,
        };
        let inner = format!("hdsd{}n{k}", pid % 100_000);
        if let Err(e) = ip(&["netns", "add", &netns.name]) {
            crate::support::skip(format!(
                "SKIPPED {test}: cannot make a network namespace ({e})"
            ));
            return None;
        }
        let host_addr = format!("{}/24", netns.host_addr());
        let mut steps: Vec<Vec<String>> = vec![
            vec![
                "link",
                "add",
                &netns.host_veth,
                "type",
                "veth",
                "peer",
                "name",
                &inner,
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            vec!["link", "set", &inner, "netns", &netns.name]
                .into_iter()
                .map(String::from)
                .collect(),
            vec!["addr", "add", &host_addr, "dev", &netns.host_veth]
                .into_iter()
                .map(String::from)
                .collect(),
            vec!["link", "set", &netns.host_veth, "up"]
                .into_iter()
                .map(String::from)
                .collect(),
        ];
        for i in 0..addresses {
            steps.push(
                [
                    "-n",
                    &netns.name,
                    "addr",
                    "add",
                    &format!("{}/24", netns.addr(i)),
                    "dev",
                    &inner,
                ]
                .into_iter()
                .map(String::from)
                .collect(),
            );
        }
        for dev in [inner.as_str(), "lo"] {
            steps.push(
                ["-n", &netns.name, "link", "set", dev, "up"]
                    .into_iter()
                    .map(String::from)
                    .collect(),
            );
        }
        for step in steps {
            let args: Vec<&str> = step.iter().map(String::as_str).collect();
            // A failure here is a broken machine, not a missing capability.
            ip(&args).unwrap_or_else(|e| panic!("{test}: {e}"));
        }
        Some(netns)
    }

    /// The host's end of the link.
    pub fn host_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.subnet, 1)
    }

    /// The namespace's `i`-th address.
    pub fn addr(&self, i: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.subnet, 2 + i)
    }

    fn iptables(&self, op: &str, addr: Ipv4Addr, port: u16) {
        let (addr, port) = (addr.to_string(), port.to_string());
        for (chain, dir_addr, dir_port) in [("INPUT", "-d", "--dport"), ("OUTPUT", "-s", "--sport")]
        {
            run(
                &format!("iptables {op} {chain} in {}", self.name),
                Command::new("ip").args([
                    "netns", "exec", &self.name, "iptables", "-w", op, chain, dir_addr, &addr,
                    "-p", "tcp", dir_port, &port, "-j", "DROP",
                ]),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        }
    }

    /// Drops every packet to and from `addr:port` (TCP) in the namespace,
    /// silently, until the [`Cut`] heals or is dropped.
    pub fn cut(&self, addr: Ipv4Addr, port: u16) -> Cut<'_> {
        self.iptables("-A", addr, port);
        Cut {
            netns: self,
            addr,
            port,
            healed: false,
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting one end deletes the pair, its address and its route.
        let _ = ip(&["link", "del", &self.host_veth]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// A link cut by [`Netns::cut`].
pub struct Cut<'a> {
    netns: &'a Netns,
    addr: Ipv4Addr,
    port: u16,
    healed: bool,
}

impl Cut<'_> {
    /// Removes the rules: packets flow again (TCP retransmits what was lost).
    pub fn heal(mut self) {
        self.heal_now();
    }

    fn heal_now(&mut self) {
        if !std::mem::replace(&mut self.healed, true) {
            self.netns.iptables("-D", self.addr, self.port);
        }
    }
}

impl Drop for Cut<'_> {
    fn drop(&mut self) {
        if !self.healed {
            self.healed = true;
            // The namespace's rules go with it anyway; no panic in a drop.
            let (addr, port) = (self.addr.to_string(), self.port.to_string());
            for (chain, a, p) in [("INPUT", "-d", "--dport"), ("OUTPUT", "-s", "--sport")] {
                let _ = Command::new("ip")
                    .args([
                        "netns",
                        "exec",
                        &self.netns.name,
                        "iptables",
                        "-w",
                        "-D",
                        chain,
                        a,
                        &addr,
                        "-p",
                        "tcp",
                        p,
                        &port,
                        "-j",
                        "DROP",
                    ])
                    .output();
            }
        }
    }
}
