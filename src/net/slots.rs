//! The slots of one listener: which connections hold them, and which one a
//! newcomer takes when a cap is reached. Pure bookkeeping (no I/O, no
//! time): [`super::Admission`] runs it under a lock.
//!
//! The rule (Envoy's overload manager is the model: admission decided by
//! who is using what): a connection that has not authenticated yet (made a
//! request hdsd answered with success) holds its slot only until someone
//! needs it. When a newcomer finds a cap reached, such a connection is
//! evicted for it: the oldest of the newcomer's own address when that
//! address is at `max_connections_per_ip`; when the listener is at
//! `max_connections`, the oldest of the address that holds the most
//! unauthenticated connections. Only when every connection in the way has
//! authenticated is the newcomer refused.
//!
//! So an attacker at its per-address cap evicts only its own connections,
//! and one spread over many addresses evicts its own before a lone
//! newcomer's: an Envoy or an operator from another address is served while
//! its connection is the only unauthenticated one of its address.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

/// Why a newcomer was refused, or why a connection was evicted for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The listener's `max_connections` are open.
    Total,
    /// The source address has `max_connections_per_ip` open.
    PerIp,
}

impl Refusal {
    /// The `reason` label of `hdsd_connections_refused_total` and
    /// `hdsd_connections_evicted_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Total => "max_connections",
            Refusal::PerIp => "max_connections_per_ip",
        }
    }
}

/// One connection's place, by accept order.
pub type SlotId = u64;

/// A newcomer's slot, and the connection evicted to make room, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    pub id: SlotId,
    pub evicted: Option<(SlotId, Refusal)>,
}

#[derive(Debug, Default)]
struct PerIp {
    open: usize,
    /// Its connections not authenticated yet, oldest first.
    unproven: BTreeSet<SlotId>,
}

/// The open connections of one listener against its two caps.
#[derive(Debug)]
pub struct Slots {
    max_total: usize,
    max_per_ip: usize,
    next: SlotId,
    /// Every open connection's address.
    open: HashMap<SlotId, IpAddr>,
    per_ip: HashMap<IpAddr, PerIp>,
    /// The addresses with connections not authenticated yet, by how many.
    by_load: BTreeSet<(usize, IpAddr)>,
    /// How many connections have not authenticated yet.
    unproven: usize,
}

impl Slots {
    pub fn new(max_total: usize, max_per_ip: usize) -> Slots {
        Slots {
            max_total,
            max_per_ip,
            next: 0,
            open: HashMap::new(),
            per_ip: HashMap::new(),
            by_load: BTreeSet::new(),
            unproven: 0,
        }
    }

    /// A slot for a newcomer from `ip`: free, or taken from the oldest
    /// connection that has not authenticated (see the module's rule).
    pub fn admit(&mut self, ip: IpAddr) -> Result<Admitted, Refusal> {
        let from_ip = self.per_ip.get(&ip).map_or(0, |p| p.open);
        let evicted = if from_ip >= self.max_per_ip {
            let victim = self
                .per_ip
                .get(&ip)
                .and_then(|p| p.unproven.first().copied());
            Some((victim.ok_or(Refusal::PerIp)?, Refusal::PerIp))
        } else if self.open.len() >= self.max_total {
            let victim = (self.by_load.last())
                .and_then(|(_, ip)| self.per_ip.get(ip))
                .and_then(|p| p.unproven.first().copied());
            Some((victim.ok_or(Refusal::Total)?, Refusal::Total))
        } else {
            None
        };
        if let Some((victim, _)) = evicted {
            self.release(victim);
        }
        let id = self.next;
        self.next += 1;
        self.open.insert(id, ip);
        let per_ip = self.per_ip.entry(ip).or_default();
        per_ip.open += 1;
        let load = per_ip.unproven.len();
        per_ip.unproven.insert(id);
        self.by_load.remove(&(load, ip));
        self.by_load.insert((load + 1, ip));
        self.unproven += 1;
        Ok(Admitted { id, evicted })
    }

    /// Takes `id` (of `ip`) off the unauthenticated ones, if it was one.
    fn proven(&mut self, id: SlotId, ip: IpAddr) {
        let Some(p) = self.per_ip.get_mut(&ip) else {
            return;
        };
        let load = p.unproven.len();
        if p.unproven.remove(&id) {
            self.by_load.remove(&(load, ip));
            if load > 1 {
                self.by_load.insert((load - 1, ip));
            }
            self.unproven -= 1;
        }
    }

    /// `id` has authenticated: it keeps its slot.
    pub fn authenticated(&mut self, id: SlotId) {
        if let Some(&ip) = self.open.get(&id) {
            self.proven(id, ip);
        }
    }

    /// Frees `id`'s slot; false when it was not held (already evicted).
    pub fn release(&mut self, id: SlotId) -> bool {
        let Some(ip) = self.open.remove(&id) else {
            return false;
        };
        self.proven(id, ip);
        if let Some(p) = self.per_ip.get_mut(&ip) {
            p.open -= 1;
            if p.open == 0 {
                self.per_ip.remove(&ip);
            }
        }
        true
    }

    /// Open connections: in total, and from `ip`.
    pub fn open(&self, ip: IpAddr) -> (usize, usize) {
        (self.open.len(), self.per_ip.get(&ip).map_or(0, |p| p.open))
    }

    /// Open connections not authenticated yet.
    pub fn unauthenticated(&self) -> usize {
        self.unproven
    }

    #[cfg(test)]
    fn addresses(&self) -> usize {
        self.per_ip.len() + self.by_load.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn free_slots_are_taken_without_eviction() {
        let mut s = Slots::new(3, 2);
        let a = s.admit(ip(1)).unwrap();
        let b = s.admit(ip(1)).unwrap();
        assert_eq!((a.id, a.evicted, b.id, b.evicted), (0, None, 1, None));
        assert_eq!(s.open(ip(1)), (2, 2));
        assert_eq!(s.unauthenticated(), 2);
    }

    #[test]
    fn at_the_per_address_cap_the_oldest_unauthenticated_of_that_address_goes() {
        let mut s = Slots::new(10, 2);
        let a = s.admit(ip(1)).unwrap().id;
        let b = s.admit(ip(1)).unwrap().id;
        let other = s.admit(ip(2)).unwrap().id;
        s.authenticated(a);
        let c = s.admit(ip(1)).unwrap();
        assert_eq!(
            c.evicted,
            Some((b, Refusal::PerIp)),
            "not a (authenticated), not the other address"
        );
        assert_eq!(s.open(ip(1)), (3, 2));
        // Both of ip(1)'s connections authenticated: refused.
        s.authenticated(c.id);
        assert_eq!(s.admit(ip(1)), Err(Refusal::PerIp));
        assert!(!s.release(b), "an evicted slot is released once");
        assert!(s.release(other));
    }

    #[test]
    fn at_the_total_cap_the_oldest_unauthenticated_of_the_busiest_address_goes() {
        let mut s = Slots::new(4, 3);
        let envoy = s.admit(ip(1)).unwrap().id;
        s.authenticated(envoy);
        let lone = s.admit(ip(2)).unwrap().id;
        let flood1 = s.admit(ip(3)).unwrap().id;
        let flood2 = s.admit(ip(3)).unwrap().id;
        // ip(3) holds two unauthenticated, ip(2) one (older): ip(3)'s oldest goes.
        let newcomer = s.admit(ip(4)).unwrap();
        assert_eq!(newcomer.evicted, Some((flood1, Refusal::Total)));
        // Now one each: the busiest by address order among equals; then
        // only authenticated ones are left in the way.
        let next = s.admit(ip(5)).unwrap();
        assert!(
            matches!(next.evicted, Some((id, Refusal::Total)) if [lone, flood2, newcomer.id].contains(&id))
        );
        for id in [lone, flood2, newcomer.id, next.id] {
            s.authenticated(id);
        }
        assert_eq!(s.admit(ip(6)), Err(Refusal::Total));
        assert_eq!(s.unauthenticated(), 0);
        assert_eq!(s.open(ip(1)), (4, 1));
    }

    #[test]
    fn released_slots_leave_no_entry() {
        let mut s = Slots::new(3, 3);
        let ids: Vec<_> = (0..3).map(|_| s.admit(ip(1)).unwrap().id).collect();
        s.authenticated(ids[1]);
        for id in ids {
            assert!(s.release(id));
        }
        assert_eq!(s.open(ip(1)), (0, 0));
        assert_eq!(s.unauthenticated(), 0);
        assert_eq!(s.addresses(), 0, "no address entry or load kept");
    }
}
