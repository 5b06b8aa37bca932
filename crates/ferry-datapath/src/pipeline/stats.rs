//! The pipeline's counters besides drops: per port, and per thing it does.

/// Per-port packet and byte counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Packets received.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets received here that the pipeline dropped (by reason in
    /// [`super::Pipeline::port_drops`]). Fragments dropped later with their datagram (expired,
    /// overlapped) and queued packets dropped later (expired, pushed out, discarded at a
    /// table swap) are counted in [`super::Pipeline::drops`] only.
    pub drops: u64,
}

/// Pipeline-wide counters besides drops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Datagrams completed from fragments.
    pub reassembled: u64,
    /// Fragments sent by refragmentation or router fragmentation.
    pub fragments_out: u64,
    /// Received super-packets treated as coalesced TCP (port `gro`).
    pub gro_marked: u64,
    /// GSO packets segmented.
    pub segmented: u64,
    /// Segments sent from segmentation.
    pub segments_out: u64,
    /// ICMP errors sent.
    pub icmp_sent: u64,
    /// ICMP errors not sent: rate limited.
    pub icmp_rate_limited: u64,
    /// ICMP errors not sent: no node address on the port, or forbidden by RFC 1122.
    pub icmp_suppressed: u64,
    /// ARP requests answered.
    pub arp_answered: u64,
    /// Neighbour solicitations answered.
    pub nd_answered: u64,
    /// ARP requests / neighbour solicitations sent to resolve a next hop.
    pub neigh_probes: u64,
    /// Packets waiting for their next hop's MAC now.
    pub neigh_waiting: u64,
    /// Packets queued to wait for their next hop's MAC.
    pub neigh_queued: u64,
    /// Queued packets sent on when their neighbour answered.
    pub neigh_released: u64,
    /// Queued packets pushed out by newer ones (`neigh_queue_overflow`).
    pub neigh_queue_overflow: u64,
    /// Queued packets whose neighbour did not answer in time (`neigh_unresolved`).
    pub neigh_queue_expired: u64,
    /// Queued packets discarded at a table swap (`neigh_queue_port_gone`).
    pub neigh_queue_port_gone: u64,
    /// Packets sent VXLAN-encapsulated.
    pub encapsulated: u64,
    /// VXLAN packets decapsulated.
    pub decapsulated: u64,
    /// UDP GSO super-frames sent to the uplink, each several encapsulated datagrams for
    /// the kernel (or the NIC) to cut apart.
    pub encap_gso_frames: u64,
    /// UDP GSO super-frames received from the uplink and split into their VXLAN
    /// datagrams.
    pub decap_gso_frames: u64,
    /// TCP segments decapsulated from such super-frames and coalesced into a segment
    /// before them (the pipeline ran once for the merged packet).
    pub decap_coalesced: u64,
    /// New connections to a Service given an endpoint.
    pub service_balanced: u64,
    /// New connections to a Service refused at once (no endpoint: TCP reset or ICMP port
    /// unreachable sent).
    pub service_rejected: u64,
    /// TCP segments from a Service endpoint of no tracked connection translated back as
    /// replies through the frontend that chose the endpoint for their client (a
    /// connection recovered after its entry was lost, see `recover`).
    pub ct_recovered: u64,
    /// Frontends tried for such segments that the client refused (a reset) or left
    /// unanswered.
    pub ct_recovery_refuted: u64,
    /// Directions of new connections that a policy rule allowed (egress from a pod of
    /// this node, ingress to one; a direction no policy applies to is not counted).
    pub policy_allowed: u64,
    /// Directions of new connections that policy denied (`policy_denied`).
    pub policy_denied: u64,
    /// Denials not recorded for the audit log: its buffer was full
    /// ([`super::Pipeline::audit_denials`]).
    pub audit_overflow: u64,
}
