//! The zone's side of zone sync: the machine of one stream to the global
//! ([`uplink`]), its reconnect delays ([`backoff`]), and the driver that
//! dials the global, feeds the machine the change feed and publishes how the
//! link stands ([`link`]).

pub mod backoff;
pub mod link;
pub mod uplink;

#[cfg(test)]
mod tests {
    /// The global refuses a heartbeat interval shorter than the one zones follow.
    #[test]
    fn the_configured_minimum_heartbeat_is_the_one_zones_follow() {
        assert_eq!(
            crate::config::MIN_ZONE_HEARTBEAT,
            super::uplink::MIN_HEARTBEAT_INTERVAL
        );
    }
}
