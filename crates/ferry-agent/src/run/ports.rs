//! The Linux ports of the tables' ports: the uplink through AF_PACKET, a host TAP, a TAP
//! per attached pod moved into its namespace; and the pod ports the worker took out of
//! service.

use std::collections::BTreeSet;

use ferry_datapath::{PortKind, Tables};
use ferry_linux::link;
use ferry_linux::{AfPacketConfig, AfPacketPort, Port, TapPort};

use crate::compile::Compiled;
use crate::status::ErrorKind;

use super::Agent;

impl Agent {
    /// Opens the Linux port of tables port `name`.
    pub(super) fn open_port(
        &mut self,
        name: &str,
        tables: &Tables,
        compiled: &Compiled,
    ) -> Result<Box<dyn Port>, String> {
        let id = tables
            .port_id(name)
            .ok_or_else(|| format!("no port {name:?}"))?;
        let p = &tables.ports[usize::from(id)];
        let port: Box<dyn Port> = match p.kind {
            PortKind::Uplink => {
                let dev = self.opts.uplink.as_deref().ok_or_else(|| {
                    format!("port {name:?} is the uplink: give its interface (--uplink IFNAME)")
                })?;
                let cfg = AfPacketConfig {
                    drop_kernel_ingress: !self.opts.share_uplink,
                    queues: self.queues(),
                    ..AfPacketConfig::default()
                };
                Box::new(
                    AfPacketPort::open(dev, &cfg)
                        .map_err(|e| format!("port {name:?}: af-packet on {dev}: {e}"))?,
                )
            }
            PortKind::Host => {
                let dev = self.opts.host_tap.as_deref().ok_or_else(|| {
                    format!("port {name:?} is a host port: give its TAP name (--host-tap NAME)")
                })?;
                Box::new(
                    TapPort::create(dev).map_err(|e| format!("port {name:?}: tap {dev}: {e}"))?,
                )
            }
            PortKind::Pod => {
                let key = compiled
                    .pod_ports
                    .iter()
                    .find(|(_, n)| n.as_str() == name)
                    .map(|(k, _)| k.clone())
                    .ok_or_else(|| format!("port {name:?}: no pod"))?;
                let (netns, ifname) = match self.cni.pods.values().find(|c| c.pod == key) {
                    Some(c) => (c.netns.clone(), c.ifname.clone()),
                    None => (
                        self.opts
                            .pods
                            .get(&key)
                            .ok_or_else(|| format!("port {name:?}: pod {key} is not attached"))?
                            .clone(),
                        "eth0".to_string(),
                    ),
                };
                if let Some(port) = self.cni.adopted.remove(&key) {
                    return Ok(port);
                }
                let cni = self.cni.pods.values().any(|c| c.pod == key);
                self.taps += 1;
                let dev = format!("fy{}t{}", std::process::id() % 100_000, self.taps);
                let tap = link::pod_tap(&dev, &netns, &ifname, p, self.queues())
                    .map_err(|e| format!("port {name:?}: {ifname} of pod {key} in {netns}: {e}"))?;
                if cni {
                    // The CNI plugin's pods keep their interface across agent restarts.
                    tap.set_persist(true).map_err(|e| {
                        format!("port {name:?}: {ifname} of pod {key}: making it persistent: {e}")
                    })?;
                    self.cni.made.push((netns, ifname));
                }
                Box::new(tap)
            }
            PortKind::Plain => {
                return Err(format!(
                    "port {name:?}: a plain port cannot be attached by the agent"
                ));
            }
        };
        if p.gso && !port.offloads() {
            return Err(format!(
                "port {name:?}: the tables say gso: true but this port does not pass GSO packets"
            ));
        }
        Ok(port)
    }

    /// Whether the worker took port `name` out of service (its device gone).
    pub(super) fn port_gone(&self, name: &str) -> bool {
        self.control
            .snapshot()
            .ports
            .iter()
            .any(|p| p.name == name && p.gone.is_some())
    }

    /// Reports, once each, the pod ports the worker took out of service because their
    /// device went away (the pod's network namespace deleted before, or without, its
    /// CNI DEL), as long as the tables in force still have them, which means the pod is
    /// still in the cluster: a warning, and an `apply` error. The port drops what is
    /// routed to it until the tables let it go (the sandbox's CNI DEL, or the Pod
    /// object deleted); a later attachment of the pod gets a new port.
    pub(super) fn report_gone_ports(&mut self) {
        let snap = self.control.snapshot();
        let mut now = BTreeSet::new();
        for p in &snap.ports {
            let Some(why) = &p.gone else { continue };
            if !self.gone_ports.contains(&p.name) {
                tracing::warn!(
                    port = %p.name,
                    error = %why,
                    "pod port out of service: its device is gone (pod network namespace \
                     deleted?); traffic to the pod is dropped until its CNI DEL or the \
                     deletion of its Pod object"
                );
                self.status.count(ErrorKind::Apply);
            }
            now.insert(p.name.clone());
        }
        self.gone_ports = now;
    }
}
