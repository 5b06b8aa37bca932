//! Why a packet was dropped: one enum for the whole datapath, counted per reason.
//!
//! Every stage that discards a packet names a [`DropReason`]. The names returned by
//! [`DropReason::name`] are stable (`snake_case`): they appear in replay verdicts,
//! metrics and traces, so renaming one is a breaking change.

use std::fmt;

macro_rules! drop_reasons {
    ($( $(#[doc = $doc:literal])* $variant:ident => $name:literal, )*) => {
        /// A reason for discarding a packet. See the module documentation.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum DropReason {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl DropReason {
            /// Every reason, in declaration order.
            pub const ALL: &'static [DropReason] = &[$(DropReason::$variant,)*];
            /// Number of reasons.
            pub const COUNT: usize = DropReason::ALL.len();

            /// The stable snake_case name of this reason.
            pub const fn name(self) -> &'static str {
                match self { $(DropReason::$variant => $name,)* }
            }

            /// The reason with this stable name, if any.
            pub fn from_name(name: &str) -> Option<DropReason> {
                match name { $($name => Some(DropReason::$variant),)* _ => None }
            }
        }
    };
}

drop_reasons! {
    // --- link layer
    /// Frame shorter than an Ethernet header.
    FrameTooShort => "frame_too_short",
    /// More than one 802.1Q/802.1ad tag.
    TooManyVlanTags => "too_many_vlan_tags",
    /// An EtherType the datapath does not forward.
    UnsupportedEthertype => "unsupported_ethertype",
    /// ARP packet too short or not Ethernet/IPv4 ARP.
    ArpMalformed => "arp_malformed",
    /// ARP on a port that does not take part in it (a `plain` port; ferry answers ARP
    /// on pod, uplink and host ports and never forwards it).
    ArpNotHandled => "arp_not_handled",
    /// An IPv6 neighbour discovery message with a hop limit other than 255, a code other
    /// than 0, a bad checksum, or truncated or malformed options, a solicitation from the
    /// unspecified address not to a solicited-node group or with a link-layer address, or
    /// a solicited advertisement to a multicast address (RFC 4861 section 7.1).
    NdMalformed => "nd_malformed",
    /// An IPv6 neighbour discovery message that came in fragments: ignored (RFC 6980
    /// section 5), as Linux does; no node fragments one.
    NdFragmented => "nd_fragmented",
    // --- IPv4
    /// IPv4 header shorter than 20 bytes, IHL below 5, or version not 4.
    Ipv4HeaderMalformed => "ipv4_header_malformed",
    /// IPv4 header checksum does not verify.
    Ipv4BadChecksum => "ipv4_bad_checksum",
    /// IP total/payload length disagrees with the header or the frame.
    IpLengthInvalid => "ip_length_invalid",
    // --- IPv6
    /// IPv6 header truncated or version not 6.
    Ipv6HeaderMalformed => "ipv6_header_malformed",
    /// An IPv6 extension header is truncated or misplaced.
    Ipv6ExtHeaderMalformed => "ipv6_ext_header_malformed",
    /// An IPv6 source or destination in the IPv4-mapped range `::ffff:0:0/96`: a form for
    /// IPv4 addresses inside a host (RFC 4291 section 2.5.5.2), not carried by IPv6
    /// packets; Linux drops such a source too. Also in the header an ICMPv6 error quotes.
    Ipv6V4MappedAddress => "ipv6_v4_mapped_address",
    // --- transport
    /// TCP header truncated or data offset invalid.
    TcpHeaderMalformed => "tcp_header_malformed",
    /// UDP header truncated or its length field invalid.
    UdpHeaderMalformed => "udp_header_malformed",
    /// SCTP packet shorter than its 12-byte common header.
    SctpHeaderMalformed => "sctp_header_malformed",
    /// ICMP/ICMPv6 message shorter than its header.
    IcmpMalformed => "icmp_malformed",
    /// VXLAN header truncated or without the valid-VNI flag.
    VxlanMalformed => "vxlan_malformed",
    /// VXLAN to this node from an address that is not a known node's.
    VxlanUnknownPeer => "vxlan_unknown_peer",
    /// VXLAN from a known node with a VNI other than the overlay's.
    VxlanBadVni => "vxlan_bad_vni",
    /// VXLAN whose outer header the underlay marked CE (congestion experienced) around
    /// an inner packet that is not ECN-capable: the mark cannot be passed on, so the
    /// packet is dropped (RFC 6040 section 4.2, as Linux's tunnels do).
    VxlanCeNotEct => "vxlan_ce_not_ect",
    /// A partial-checksum request (virtio-net NEEDS_CSUM) points outside the packet.
    CsumOffloadInvalid => "csum_offload_invalid",
    // --- IP fragments
    /// A fragment overlaps another fragment of the same datagram; the datagram is dropped.
    FragOverlap => "frag_overlap",
    /// A non-final fragment smaller than the configured minimum.
    FragTooSmall => "frag_too_small",
    /// A non-final fragment whose data length is not a multiple of 8.
    FragLengthNotMultipleOf8 => "frag_length_not_multiple_of_8",
    /// An IPv6 first fragment without the whole header chain (RFC 7112).
    FragIncompleteHeaderChain => "frag_incomplete_header_chain",
    /// A first fragment too short to hold the transport header (RFC 1858).
    FragFirstTooShort => "frag_first_too_short",
    /// A TCP fragment at offset 8 bytes, which could rewrite the TCP flags (RFC 3128).
    FragTcpOffsetOne => "frag_tcp_offset_one",
    /// The reassembled datagram would exceed 65535 bytes.
    FragDatagramTooBig => "frag_datagram_too_big",
    /// Fragments disagree about where the datagram ends.
    FragInconsistentEnd => "frag_inconsistent_end",
    /// The fragment table is full (datagrams or bytes); new datagrams are refused.
    FragTableFull => "frag_table_full",
    /// A source has the most fragmented datagrams in flight it may have; its new ones are
    /// refused.
    FragSourceLimit => "frag_source_limit",
    /// A datagram arrived in more fragments than the per-datagram limit; it is dropped.
    FragTooMany => "frag_too_many",
    /// The fragments of a datagram mix Not-ECT with ECT or CE (RFC 3168 section 5.3); the
    /// datagram is dropped.
    FragEcnMismatch => "frag_ecn_mismatch",
    /// A fragment held for reassembly expired before its datagram completed.
    FragExpired => "frag_expired",
    /// A fragment of a datagram that was already dropped for another reason.
    FragDatagramFailed => "frag_datagram_failed",
    // --- GSO
    /// A GSO request that is inconsistent with the packet it describes.
    GsoMalformed => "gso_malformed",
    /// A GSO type the datapath cannot segment (e.g. ECN-only or unknown).
    GsoUnsupported => "gso_unsupported",
    // --- connection tracking and NAT
    /// Conntrack found the packet INVALID (out of window, unsolicited reply, an ICMP
    /// error about no known connection, ...); dropped unless configured to pass.
    CtInvalid => "ct_invalid",
    /// The connection table is full and nothing could be evicted; new connection refused.
    CtTableFull => "ct_table_full",
    /// No free NAT port for a new connection; it is refused, existing ones are untouched.
    NatPortExhausted => "nat_port_exhausted",
    // --- services
    /// A new connection to a Service port that has no usable endpoint: refused with a TCP
    /// reset or an ICMP port unreachable.
    ServiceNoEndpoints => "service_no_endpoints",
    /// A new connection to a Service whose traffic policy is Local, on a node without a
    /// local endpoint: dropped, as kube-proxy does.
    ServiceNoLocalEndpoints => "service_no_local_endpoints",
    /// A new connection to a Service that must leave from this node's address (external
    /// or outside-the-cluster traffic to another node's endpoint, in SNAT mode or out of
    /// the tunnel's reach) when the node has no address of its family: refused, since
    /// with the client address kept the replies would not come back to be translated.
    ServiceNoNodeAddress => "service_no_node_address",
    /// A new connection to a Service's load balancer IP from a source outside the
    /// Service's `loadBalancerSourceRanges`: dropped, as kube-proxy drops it.
    ServiceSourceDenied => "service_source_denied",
    // --- policy
    /// A new connection that NetworkPolicy or ClusterNetworkPolicy does not allow: a
    /// rule denied it, or policies isolate the pod and none of their rules matched.
    PolicyDenied => "policy_denied",
    // --- forwarding
    /// The packet arrived on a port that the tables do not know.
    UnknownPort => "unknown_port",
    /// No route for the destination address.
    NoRoute => "no_route",
    /// The destination is in this node's pod CIDRs (`node.pod_cidrs`) and no pod has it
    /// (a pod just deleted, a scan): answered with an ICMP host / address unreachable,
    /// never sent along a shorter route, which could loop it back here.
    NoSuchPod => "no_such_pod",
    /// A pod sent from a MAC or IP address that is not its own.
    SourceSpoofed => "source_spoofed",
    /// An 802.1Q/802.1ad tagged frame on a pod, uplink or host port. Each carries one
    /// untagged network: a tag from a pod would carry its frame onto another VLAN of the
    /// underlay, and a tagged frame on the uplink (a trunk) is another VLAN's traffic.
    VlanTagged => "vlan_tagged",
    /// A frame on an uplink or host port addressed to another host's unicast MAC (a
    /// switch flooding an unlearned destination to the promiscuous uplink): not the
    /// node's to answer or forward, as Linux drops `PACKET_OTHERHOST` frames.
    OtherHost => "other_host",
    /// A source or destination that a router does not forward: link-local, multicast,
    /// loopback (IPv4 169.254/16 unless a route names the address, 224/4, 127/8, 0/8 and
    /// 240/4 with the broadcast address; IPv6 fe80::/10, ff00::/8, ::1, the unspecified
    /// address).
    NotForwardable => "not_forwardable",
    /// The next hop's MAC did not become known in time: the packet waited for it (an ARP
    /// request / neighbour solicitation went out) until the resolution timeout.
    NeighUnresolved => "neigh_unresolved",
    /// A packet waiting for its next hop's MAC was pushed out by newer ones: its
    /// neighbour already had as many waiting as allowed, or the queue was full.
    NeighQueueOverflow => "neigh_queue_overflow",
    /// A packet waiting for its next hop's MAC was discarded at a table swap: its ingress
    /// or egress port went or has another index now, or its overlay node went.
    NeighQueuePortGone => "neigh_queue_port_gone",
    /// The next hop has no neighbour entry and none could be made: the neighbour table is
    /// full of entries in use (Linux's "neighbour table overflow").
    NeighTableFull => "neigh_table_full",
    /// The next hop has no neighbour entry, and the node's probes (ARP requests,
    /// neighbour solicitations) were used up: no entry is made, no probe sent. Traffic to
    /// many addresses of an on-link subnet, a scan.
    NeighProbeLimited => "neigh_probe_limited",
    /// TTL or hop limit reached zero.
    TtlExceeded => "ttl_exceeded",
    /// Too big for the egress MTU with DF set (IPv4) or IPv6 not from reassembly.
    TooBig => "too_big",
    /// The egress MTU is too small to carry even one fragment.
    MtuTooSmall => "mtu_too_small",
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Per-reason drop counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DropCounters {
    counts: [u64; DropReason::COUNT],
}

impl Default for DropCounters {
    fn default() -> Self {
        DropCounters {
            counts: [0; DropReason::COUNT],
        }
    }
}

impl DropCounters {
    /// Counts one drop for `reason`.
    #[inline]
    pub fn count(&mut self, reason: DropReason) {
        self.add(reason, 1);
    }

    /// Counts `n` drops for `reason`.
    #[inline]
    pub fn add(&mut self, reason: DropReason, n: u64) {
        self.counts[reason as usize] += n;
    }

    /// Drops counted for `reason`.
    pub fn get(&self, reason: DropReason) -> u64 {
        self.counts[reason as usize]
    }

    /// Total drops over all reasons.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The reasons with a non-zero count, in declaration order.
    pub fn nonzero(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL
            .iter()
            .map(|r| (*r, self.counts[*r as usize]))
            .filter(|(_, n)| *n > 0)
    }

    /// Adds every count of `other` to this one.
    pub fn merge(&mut self, other: &DropCounters) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_snake_case_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for r in DropReason::ALL {
            let n = r.name();
            assert!(seen.insert(n), "duplicate name {n}");
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{n} is not snake_case"
            );
            assert_eq!(DropReason::from_name(n), Some(*r));
        }
        assert_eq!(DropReason::from_name("no_such_reason"), None);
    }

    #[test]
    fn counters_count_per_reason() {
        let mut c = DropCounters::default();
        c.count(DropReason::NoRoute);
        c.add(DropReason::FragOverlap, 3);
        assert_eq!(c.get(DropReason::NoRoute), 1);
        assert_eq!(c.get(DropReason::FragOverlap), 3);
        assert_eq!(c.get(DropReason::TooBig), 0);
        assert_eq!(c.total(), 4);
        let v: Vec<_> = c.nonzero().collect();
        assert_eq!(
            v,
            vec![(DropReason::FragOverlap, 3), (DropReason::NoRoute, 1)]
        );
    }
}

#[cfg(test)]
mod docs {
    use super::DropReason;

    /// Users look reasons up in docs/datapath.md: every reason must be listed there.
    #[test]
    fn every_reason_is_documented() {
        let doc = include_str!("../../../docs/datapath.md");
        for r in DropReason::ALL {
            assert!(
                doc.contains(&format!("| `{}` |", r.name())),
                "docs/datapath.md does not list {}",
                r.name()
            );
        }
    }
}
