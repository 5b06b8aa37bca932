//! The agent's health as others check it: the health check node ports of Services with
//! externalTrafficPolicy Local ([`crate::health`]) and kube-proxy's `/healthz` and
//! `/livez` ([`crate::proxy_health`]), each listened on again while it cannot be.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::compile::HealthCheck;
use crate::health::HealthServers;
use crate::proxy_health::{HealthzServer, ProxyHealth};
use crate::status::{AgentStatus, ErrorKind};

use super::LISTEN_RETRY;

/// The health servers and what is retried of them.
pub(super) struct Health {
    /// Where to serve `/healthz` ([`super::Options::healthz`]).
    addr: Option<SocketAddr>,
    /// The health check node ports.
    servers: HealthServers,
    /// The agent's own health, as `/healthz` and the health check node ports report it.
    pub(super) proxy: Arc<ProxyHealth>,
    /// The `/healthz` server, once [`Health::addr`] could be listened on.
    healthz: Option<HealthzServer>,
    /// Listening on [`Health::addr`] failed (reported once until it works).
    healthz_failing: bool,
    /// When [`Health::serve_healthz`] tries again ([`LISTEN_RETRY`]).
    healthz_due: Instant,
    /// Health check node ports that could not be opened, each reported once until it
    /// opens.
    failing: BTreeSet<u16>,
    /// When [`Health::retry`] tries them again ([`LISTEN_RETRY`]).
    due: Instant,
}

impl Health {
    /// Nothing served yet; `/healthz` is to be served at `addr`.
    pub(super) fn new(addr: Option<SocketAddr>) -> Health {
        let proxy = Arc::new(ProxyHealth::new());
        Health {
            addr,
            servers: HealthServers::new(Arc::clone(&proxy)),
            proxy,
            healthz: None,
            healthz_failing: false,
            healthz_due: Instant::now(),
            failing: BTreeSet::new(),
            due: Instant::now(),
        }
    }

    /// The health check node ports served.
    pub(super) fn ports(&self) -> Vec<u16> {
        self.servers.ports()
    }

    /// The address `/healthz` is served on, once it is.
    pub(super) fn healthz_addr(&self) -> Option<SocketAddr> {
        self.healthz.as_ref().map(HealthzServer::addr)
    }

    /// Listens on [`Health::addr`] unless done already; a failure is logged, counted
    /// ([`ErrorKind::Apply`]) the first time, and tried again every [`LISTEN_RETRY`].
    pub(super) fn serve_healthz(&mut self, status: &mut AgentStatus) {
        let Some(addr) = self.addr else {
            return;
        };
        if self.healthz.is_some() || Instant::now() < self.healthz_due {
            return;
        }
        self.healthz_due = Instant::now() + LISTEN_RETRY;
        match HealthzServer::bind(addr, Arc::clone(&self.proxy)) {
            Ok(s) => {
                if self.healthz_failing {
                    tracing::info!(%addr, "/healthz served after all");
                }
                self.healthz_failing = false;
                self.healthz = Some(s);
            }
            Err(e) if !self.healthz_failing => {
                tracing::warn!(%addr, error = %e,
                    "/healthz not served; trying again every {LISTEN_RETRY:?}");
                status.count(ErrorKind::Apply);
                self.healthz_failing = true;
            }
            Err(e) => tracing::debug!(%addr, error = %e, "/healthz still not served"),
        }
    }

    /// Serves the health check node ports of `checks`, and only those.
    pub(super) fn set(&mut self, checks: &[HealthCheck], status: &mut AgentStatus) {
        let failed = self.servers.set(checks);
        self.opened(failed, status);
    }

    /// Tries again, every [`LISTEN_RETRY`], the health check node ports that could not
    /// be opened: in a quiet cluster no change would.
    pub(super) fn retry(&mut self, status: &mut AgentStatus) {
        if self.failing.is_empty() || Instant::now() < self.due {
            return;
        }
        self.due = Instant::now() + LISTEN_RETRY;
        let failed = self.servers.open_missing();
        self.opened(failed, status);
    }

    /// Reports the health check node ports that could not be opened (`failed`): a
    /// warning and an [`ErrorKind::Apply`] error the first time, and a note when one
    /// that failed opens.
    fn opened(&mut self, failed: Vec<(u16, std::io::Error)>, status: &mut AgentStatus) {
        let now: BTreeSet<u16> = failed.iter().map(|(p, _)| *p).collect();
        for (port, e) in &failed {
            if self.failing.contains(port) {
                tracing::debug!(port, error = %e, "health check node port still not served");
            } else {
                tracing::warn!(port, error = %e,
                    "health check node port not served; trying again every {LISTEN_RETRY:?}");
                status.count(ErrorKind::Apply);
            }
        }
        if self.failing.is_empty() && !now.is_empty() {
            self.due = Instant::now() + LISTEN_RETRY;
        }
        let served = self.servers.ports();
        for port in self.failing.difference(&now) {
            if served.contains(port) {
                tracing::info!(port, "health check node port served after all");
            }
        }
        self.failing = now;
    }
}
