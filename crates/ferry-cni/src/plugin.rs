//! One invocation of the plugin: the environment and standard input in, what to print
//! and the exit status out.
//!
//! Everything is checked before anything is changed or asked: a bad request takes no
//! lease and sends the agent nothing.

use std::io::{self, Read, Write};
use std::net::IpAddr;

use ferry_api::{Answer, Attachment, Request, Response};
use ipnet::IpNet;
use serde_json::{Value, json};

use crate::agent::{Agent, CallError, is_timeout};
use crate::config::{self, NetConf};
use crate::env::{Command, Environment, pod_from_args};
use crate::error::{Error, code};
use crate::ipam::{self, range::RangeSet, store::Store};
use crate::result::{self, Attached};
use crate::version::Version;

/// What one invocation printed and how it ends.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// For standard output: ADD's result, VERSION's answer, an error object, or
    /// nothing (DEL, CHECK, STATUS and GC print nothing when they succeed).
    pub stdout: Option<Value>,
    /// Lines for standard error: what went wrong without failing the command (the
    /// runtime logs them).
    pub stderr: Vec<String>,
    /// Whether the command succeeded (exit status 0, else 1).
    pub success: bool,
}

impl Outcome {
    /// Writes the outcome out; returns the exit status.
    pub fn emit(&self, stdout: &mut dyn Write, stderr: &mut dyn Write) -> i32 {
        for line in &self.stderr {
            let _ = writeln!(stderr, "ferry-cni: {line}");
        }
        if let Some(v) = &self.stdout {
            let text = serde_json::to_string_pretty(v).expect("JSON values serialize");
            if writeln!(stdout, "{text}")
                .and_then(|()| stdout.flush())
                .is_err()
            {
                // The runtime reads the result from standard output: without it the
                // command did not happen as far as the runtime knows.
                return 1;
            }
        }
        if self.success { 0 } else { 1 }
    }
}

/// Runs the command the environment names, reading the network configuration from
/// `stdin`. `var` reads an environment variable.
pub fn run(var: impl Fn(&str) -> Option<String>, stdin: &mut dyn Read) -> Outcome {
    let mut warnings = Vec::new();
    let mut version = Version::LATEST;
    let outcome = invoke(var, stdin, &mut version, &mut warnings);
    match outcome {
        Ok(stdout) => Outcome {
            stdout,
            stderr: warnings,
            success: true,
        },
        Err(e) => Outcome {
            stdout: Some(e.to_json(version.as_str())),
            stderr: warnings,
            success: false,
        },
    }
}

/// VERSION's answer.
pub fn version_info() -> Value {
    let all: Vec<&str> = Version::ALL.iter().map(|v| v.as_str()).collect();
    json!({"cniVersion": Version::LATEST.as_str(), "supportedVersions": all})
}

fn invoke(
    var: impl Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    version: &mut Version,
    warnings: &mut Vec<String>,
) -> Result<Option<Value>, Error> {
    let env = Environment::from_vars(var)?;
    let mut input = Vec::new();
    let read = stdin.read_to_end(&mut input);
    if env.command == Command::Version {
        // VERSION is how a runtime finds out which versions to speak, so it answers
        // whatever version its input names, and even when the input cannot be read.
        return Ok(Some(version_info()));
    }
    read.map_err(|e| {
        Error::new(
            code::IO_FAILURE,
            "reading the network configuration from standard input failed",
            e.to_string(),
        )
    })?;
    let doc = config::parse_object(&input)?;
    *version = config::version_of(&doc)?;
    if !version.allows(env.command) {
        return Err(Error::new(
            code::INCOMPATIBLE_VERSION,
            format!(
                "{} needs cniVersion 1.1.0 or later, the configuration is {}",
                env.command.as_str(),
                version.as_str()
            ),
            "",
        ));
    }
    let conf = NetConf::from_object(doc)?;
    let call = Call {
        agent: Agent::new(&conf.socket),
        env: &env,
        conf: &conf,
        warnings,
    };
    match env.command {
        Command::Add => call.add().map(Some),
        Command::Del => call.del().map(|()| None),
        Command::Check => call.check().map(|()| None),
        Command::Status => call.status().map(|()| None),
        Command::Gc => call.gc().map(|()| None),
        Command::Version => unreachable!("answered above"),
    }
}

/// A command with its checked inputs.
struct Call<'a> {
    agent: Agent,
    env: &'a Environment,
    conf: &'a NetConf,
    warnings: &'a mut Vec<String>,
}

impl Call<'_> {
    fn attachment(&self) -> Attachment {
        Attachment {
            container_id: self.env.container_id.clone(),
            ifname: self.env.ifname.clone(),
        }
    }

    /// The agent's answer to `request`, its error answers passed through.
    fn ask(&self, request: &Request) -> Result<Result<Answer, Error>, CallError> {
        Ok(match self.agent.call(request)? {
            Response::Ok(answer) => Ok(answer),
            Response::Error(e) => Err(e.into()),
        })
    }

    /// The error for a request that got no answer.
    fn no_answer(&self, e: &CallError) -> Error {
        let socket = self.agent.socket().display();
        let code = match e {
            CallError::NotRunning(_) => code::TRY_AGAIN_LATER,
            CallError::Io(io) if is_timeout(io) => code::TRY_AGAIN_LATER,
            CallError::Connect(_) | CallError::Io(_) => code::IO_FAILURE,
            CallError::BadAnswer(_) => code::DECODING_FAILURE,
        };
        Error::new(code, format!("ferry agent at {socket}"), e.to_string())
    }

    fn store(&self) -> Result<Store, Error> {
        Store::open(&self.conf.data_dir, &self.conf.name).map_err(|e| {
            Error::new(
                code::IO_FAILURE,
                format!(
                    "lease directory {}",
                    self.conf.data_dir.join(&self.conf.name).display()
                ),
                e.to_string(),
            )
        })
    }

    /// The lease directory, if there is one yet.
    fn existing_store(&self) -> Result<Option<Store>, Error> {
        Store::existing(&self.conf.data_dir, &self.conf.name).map_err(|e| {
            Error::new(
                code::IO_FAILURE,
                format!(
                    "lease directory {}",
                    self.conf.data_dir.join(&self.conf.name).display()
                ),
                e.to_string(),
            )
        })
    }

    /// ADD: leases from the node's pod CIDRs, then the interface from the agent.
    fn add(self) -> Result<Value, Error> {
        let pod = pod_from_args(&self.env.args)?;
        let who = self.attachment();
        let netns = self.env.required_netns().to_string();

        let node = self.ask(&Request::Node).map_err(|e| self.no_answer(&e))??;
        let sets = range_sets(&node)?;
        let store = self.store()?;
        let alloc = ipam::allocate(&store, &sets, &who)?;

        let request = Request::Add {
            container_id: who.container_id.clone(),
            netns: netns.clone(),
            ifname: who.ifname.clone(),
            pod,
            addresses: alloc.addresses.iter().map(IpNet::to_string).collect(),
        };
        let failed = match self.ask(&request) {
            Ok(Ok(added)) => {
                let attached = Attached {
                    ifname: who.ifname,
                    mac: added.mac,
                    mtu: added.mtu.or(node.mtu),
                    sandbox: netns,
                    addresses: alloc.addresses,
                    gateways: added.gateways,
                };
                return Ok(result::add_result(
                    self.conf.version,
                    self.conf.prev_result.as_ref(),
                    &attached,
                    &self.conf.dns,
                ));
            }
            Ok(Err(refused)) => refused,
            Err(e) => {
                if e.maybe_done() {
                    // The agent may have made the interface with these addresses: undo
                    // it before the addresses go back to the pool.
                    if let Err(why) = self.agent_del(&who) {
                        self.warnings.push(format!(
                            "ADD failed halfway and the agent could not undo it: {why}"
                        ));
                    }
                }
                self.no_answer(&e)
            }
        };
        if let Err(e) = ipam::release_addresses(&store, &alloc.taken) {
            self.warnings
                .push(format!("the leases of the failed ADD stay taken: {e}"));
        }
        Err(failed)
    }

    /// The agent's DEL, "unknown container" being success.
    fn agent_del(&self, who: &Attachment) -> Result<(), AgentDelError> {
        let request = Request::Del {
            container_id: who.container_id.clone(),
            ifname: who.ifname.clone(),
        };
        match self.ask(&request) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) if e.code == code::UNKNOWN_CONTAINER => Ok(()),
            Ok(Err(e)) => Err(AgentDelError::Refused(e)),
            Err(e) => Err(AgentDelError::NoAnswer(e)),
        }
    }

    /// DEL: the interface, then the leases.
    ///
    /// The leases go last so that an address is never free while the agent may still
    /// route it to the old pod: when the agent fails, DEL fails with the leases kept,
    /// and the runtime's retry finds them. An agent that is not running is the
    /// exception, so that pods can be deleted while it is down: the DEL is queued for
    /// it ([`Agent::queue_del`]), which it carries out before it adopts the
    /// attachments it recorded and so before it forwards anything to the pod again,
    /// and the leases are released. When the DEL cannot be queued, DEL fails and keeps
    /// the leases.
    fn del(self) -> Result<(), Error> {
        let who = self.attachment();
        match self.agent_del(&who) {
            Ok(()) => {}
            Err(AgentDelError::NoAnswer(CallError::NotRunning(e))) => {
                let socket = self.agent.socket().display();
                let queued = self
                    .agent
                    .queue_del(&who.container_id, &who.ifname)
                    .map_err(|qe| {
                        Error::new(
                            code::IO_FAILURE,
                            format!(
                                "the agent at {socket} is not running and the DEL cannot be \
                                 queued for it in {}",
                                self.agent.del_queue().display()
                            ),
                            qe.to_string(),
                        )
                    })?;
                self.warnings.push(match queued {
                    Some(file) => format!(
                        "the agent at {socket} is not running ({e}); the DEL of {} {} is \
                         queued for it in {}; releasing the leases",
                        who.container_id,
                        who.ifname,
                        file.display()
                    ),
                    None => format!(
                        "the agent at {socket} is not running ({e}) and has not run since \
                         the node booted (no {}); releasing the leases of {} {}",
                        self.agent
                            .socket()
                            .parent()
                            .unwrap_or(self.agent.socket())
                            .display(),
                        who.container_id,
                        who.ifname
                    ),
                });
            }
            Err(AgentDelError::Refused(e)) => return Err(e),
            Err(AgentDelError::NoAnswer(e)) => return Err(self.no_answer(&e)),
        }
        if let Some(store) = self.existing_store()? {
            ipam::release(&store, &who)?;
        }
        Ok(())
    }

    /// CHECK: `prevResult` against the leases and the agent.
    fn check(self) -> Result<(), Error> {
        let prev = self.conf.prev_result.as_ref().ok_or_else(|| {
            Error::new(
                code::INVALID_NETWORK_CONFIG,
                "CHECK needs prevResult in the network configuration",
                "",
            )
        })?;
        let who = self.attachment();
        let netns = self.env.required_netns();
        let expected = result::expected(prev, &who.ifname, netns)?;
        let mut held = match self.existing_store()? {
            Some(store) => ipam::held_by(&store, &who)?,
            None => Vec::new(),
        };

        let request = Request::Check {
            container_id: who.container_id.clone(),
            ifname: who.ifname.clone(),
            netns: netns.to_string(),
        };
        let answer = match self.ask(&request).map_err(|e| self.no_answer(&e))? {
            Ok(answer) => answer,
            Err(e) if e.code == code::UNKNOWN_CONTAINER && held.is_empty() => {
                return Err(Error::new(
                    code::UNKNOWN_CONTAINER,
                    format!(
                        "no attachment of container {} on {}",
                        who.container_id, who.ifname
                    ),
                    "neither the agent nor the leases know it",
                ));
            }
            Err(e) if e.code == code::UNKNOWN_CONTAINER => {
                return Err(Error::new(
                    code::CHECK_FAILED,
                    format!(
                        "the agent has no interface for container {} on {}",
                        who.container_id, who.ifname
                    ),
                    format!("its addresses are still leased: {}", list(&held)),
                ));
            }
            Err(e) => return Err(e),
        };

        let mut want = expected.addresses;
        want.sort();
        held.sort();
        if want != held {
            return Err(Error::new(
                code::CHECK_FAILED,
                format!(
                    "the leases of container {} on {} differ from prevResult",
                    who.container_id, who.ifname
                ),
                format!("prevResult lists {}, leased: {}", list(&want), list(&held)),
            ));
        }
        if let (Some(want), Some(got)) = (&expected.mac, &answer.mac)
            && !want.eq_ignore_ascii_case(got)
        {
            return Err(Error::new(
                code::CHECK_FAILED,
                format!("{} has MAC {got}, prevResult says {want}", who.ifname),
                "",
            ));
        }
        Ok(())
    }

    /// STATUS: whether the agent can take pods. Not when it does not answer (51: its
    /// process carries the node's pods' traffic), when it says it cannot (its code), or
    /// when an ADD would find no pod CIDR for this node (50).
    fn status(self) -> Result<(), Error> {
        let unavailable = |e: CallError| {
            Error::new(
                code::LIMITED_CONNECTIVITY,
                format!(
                    "the ferry agent at {} is not available: the node's pods have no \
                     forwarding until it is back",
                    self.agent.socket().display()
                ),
                e.to_string(),
            )
        };
        self.ask(&Request::Status).map_err(unavailable)??;
        let node = self.ask(&Request::Node).map_err(unavailable)?;
        let node = node.map_err(|e| Error::new(code::PLUGIN_NOT_AVAILABLE, e.msg, e.details))?;
        range_sets(&node)
            .map(|_| ())
            .map_err(|e| Error::new(code::PLUGIN_NOT_AVAILABLE, e.msg, e.details))
    }

    /// GC: stale leases first, then the agent's stale attachments; an error in one
    /// does not stop the other.
    fn gc(self) -> Result<(), Error> {
        let valid = self.conf.valid_attachments.clone().ok_or_else(|| {
            // Taking a missing list as an empty one would release every lease.
            Error::new(
                code::INVALID_NETWORK_CONFIG,
                "GC needs cni.dev/valid-attachments in the network configuration",
                "",
            )
        })?;
        let mut errors = Vec::new();
        match self.existing_store() {
            Ok(Some(store)) => {
                if let Err(e) = ipam::gc(&store, &valid) {
                    errors.push(e);
                }
            }
            Ok(None) => {}
            Err(e) => errors.push(e),
        }
        match self.ask(&Request::Gc { valid }) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => errors.push(e),
            // As for DEL: an agent that is not running holds no attachment.
            Err(CallError::NotRunning(e)) => self.warnings.push(format!(
                "the agent at {} is not running ({e}); only leases were collected",
                self.agent.socket().display()
            )),
            Err(e) => errors.push(self.no_answer(&e)),
        }
        let mut errors = errors.into_iter();
        match errors.next() {
            None => Ok(()),
            Some(mut first) => {
                for more in errors {
                    if !first.details.is_empty() {
                        first.details.push_str("; ");
                    }
                    first.details.push_str(&more.to_string());
                }
                Err(first)
            }
        }
    }
}

/// Why the agent's DEL did not succeed.
enum AgentDelError {
    /// It answered with an error.
    Refused(Error),
    /// It did not answer.
    NoAnswer(CallError),
}

impl std::fmt::Display for AgentDelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentDelError::Refused(e) => e.fmt(f),
            AgentDelError::NoAnswer(e) => e.fmt(f),
        }
    }
}

/// The range sets of the node's pod CIDRs.
fn range_sets(node: &Answer) -> Result<Vec<RangeSet>, Error> {
    let name = node.node.as_deref().unwrap_or("this node");
    if node.pod_cidrs.is_empty() {
        return Err(Error::new(
            code::TRY_AGAIN_LATER,
            format!("{name} has no pod CIDR yet"),
            "pod addresses come from the node's spec.podCIDRs",
        ));
    }
    let mut nets = Vec::new();
    for cidr in &node.pod_cidrs {
        nets.push(cidr.parse::<IpNet>().map_err(|e| {
            Error::new(
                code::DECODING_FAILURE,
                format!("the agent gave {name} the pod CIDR {cidr:?}"),
                e.to_string(),
            )
        })?);
    }
    RangeSet::by_family(&nets).map_err(|small| {
        Error::new(
            code::INVALID_NETWORK_CONFIG,
            format!(
                "{name}'s pod CIDR {} is too small to allocate from",
                small.0
            ),
            "a pod CIDR needs at least four addresses",
        )
    })
}

fn list(ips: &[IpAddr]) -> String {
    if ips.is_empty() {
        return "none".into();
    }
    ips.iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The binary's CNI mode: the process environment, standard input, standard output.
/// Returns the exit status.
pub fn main() -> i32 {
    use std::io::IsTerminal;

    let var = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    let stdin = io::stdin();
    // Run by hand from a terminal, do not wait for input that is not coming.
    let outcome = if stdin.is_terminal() {
        run(var, &mut io::empty())
    } else {
        run(var, &mut stdin.lock())
    };
    outcome.emit(&mut io::stdout().lock(), &mut io::stderr().lock())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use super::*;

    struct Fails;

    impl Read for Fails {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::Error::other("stdin broke"))
        }
    }

    fn run_with(vars: &[(&str, &str)], stdin: &str) -> Outcome {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        run(|k| map.get(k).cloned(), &mut stdin.as_bytes())
    }

    fn add_vars() -> Vec<(&'static str, &'static str)> {
        vec![
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/var/run/netns/pod"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web"),
            ("CNI_PATH", "/opt/cni/bin"),
        ]
    }

    /// A configuration whose socket and lease directory are under `dir`.
    fn conf(dir: &Path, version: &str) -> String {
        json!({
            "cniVersion": version,
            "name": "ferry",
            "type": "ferry-cni",
            "socket": dir.join("agent.sock"),
            "dataDir": dir.join("leases"),
        })
        .to_string()
    }

    fn error_code(o: &Outcome) -> u64 {
        assert!(!o.success, "{o:?}");
        o.stdout.as_ref().unwrap()["code"].as_u64().unwrap()
    }

    /// Nothing was made: no lease directory (and, with no socket there, nothing could
    /// have been asked of an agent).
    fn nothing_done(dir: &Path) {
        assert!(!dir.join("leases").exists());
    }

    #[test]
    fn test_version_answers_whatever_its_input() {
        for stdin in ["", "{\"cniVersion\": \"0.1.0\"}", "garbage"] {
            let o = run_with(&[("CNI_COMMAND", "VERSION")], stdin);
            assert!(o.success);
            assert_eq!(
                o.stdout.unwrap(),
                json!({"cniVersion": "1.1.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]})
            );
        }
        let o = run(
            |k| (k == "CNI_COMMAND").then(|| "VERSION".to_string()),
            &mut Fails,
        );
        assert!(o.success);
    }

    #[test]
    fn test_unreadable_stdin_is_code_5() {
        let o = run(
            |k| {
                add_vars()
                    .into_iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            },
            &mut Fails,
        );
        assert_eq!(error_code(&o), 5);
        assert_eq!(o.stdout.unwrap()["details"], "stdin broke");
    }

    #[test]
    fn test_bad_environment_is_code_4_and_takes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let conf = conf(tmp.path(), "1.1.0");
        for (name, value) in [
            ("CNI_COMMAND", "ATTACH"),
            ("CNI_CONTAINERID", ""),
            ("CNI_CONTAINERID", "../x"),
            ("CNI_IFNAME", "way-too-long-name"),
            ("CNI_NETNS", "pod"),
            ("CNI_ARGS", "K8S_POD_NAME=web"),
            (
                "CNI_ARGS",
                "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;junk",
            ),
        ] {
            let mut vars = add_vars();
            vars.retain(|(k, _)| *k != name);
            vars.push((name, value));
            let o = run_with(&vars, &conf);
            assert_eq!(error_code(&o), 4, "{name}={value}");
            let out = o.stdout.unwrap();
            assert_eq!(out["cniVersion"], "1.1.0");
            assert!(out["msg"].as_str().unwrap().contains(name), "{out}");
            nothing_done(tmp.path());
        }
    }

    #[test]
    fn test_bad_configuration_takes_nothing_and_names_its_code() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let good: Value = serde_json::from_str(&conf(dir, "1.0.0")).unwrap();
        let with = |key: &str, v: Value| {
            let mut c = good.clone();
            c[key] = v;
            c.to_string()
        };
        for (stdin, want) in [
            (String::new(), 6),
            ("{\"cniVersion\": ".to_string(), 6),
            ("[]".to_string(), 6),
            (with("cniVersion", json!("0.3.1")), 1),
            (with("cniVersion", json!(true)), 6),
            (with("name", json!("")), 7),
            (with("name", json!("a/b")), 7),
            (with("socket", json!("relative.sock")), 7),
            (with("dataDir", json!(7)), 6),
            (with("ipam", json!({"type": "host-local"})), 2),
        ] {
            let o = run_with(&add_vars(), &stdin);
            assert_eq!(error_code(&o), want, "{stdin}");
            nothing_done(dir);
        }
    }

    #[test]
    fn test_errors_answer_in_the_request_version_once_known() {
        let tmp = tempfile::tempdir().unwrap();
        let mut vars = add_vars();
        vars.retain(|(k, _)| *k != "CNI_ARGS");
        let o = run_with(&vars, &conf(tmp.path(), "0.4.0"));
        assert_eq!(error_code(&o), 4);
        assert_eq!(o.stdout.unwrap()["cniVersion"], "0.4.0");
        // Before the version is read, the newest.
        let o = run_with(&vars, "{");
        assert_eq!(o.stdout.unwrap()["cniVersion"], "1.1.0");
    }

    #[test]
    fn test_status_and_gc_before_1_1_0_are_code_1() {
        let tmp = tempfile::tempdir().unwrap();
        for command in ["STATUS", "GC"] {
            for version in ["0.4.0", "1.0.0"] {
                let o = run_with(
                    &[("CNI_COMMAND", command), ("CNI_PATH", "/opt/cni/bin")],
                    &conf(tmp.path(), version),
                );
                assert_eq!(error_code(&o), 1, "{command} {version}");
            }
        }
    }

    #[test]
    fn test_check_without_prev_result_is_code_7() {
        let tmp = tempfile::tempdir().unwrap();
        let mut vars = add_vars();
        vars[0] = ("CNI_COMMAND", "CHECK");
        let o = run_with(&vars, &conf(tmp.path(), "1.1.0"));
        assert_eq!(error_code(&o), 7);
    }

    #[test]
    fn test_gc_without_valid_attachments_is_code_7_and_releases_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let leases = tmp.path().join("leases/ferry");
        std::fs::create_dir_all(&leases).unwrap();
        std::fs::write(leases.join("10.0.0.2"), "c1\r\neth0").unwrap();
        let o = run_with(
            &[("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")],
            &conf(tmp.path(), "1.1.0"),
        );
        assert_eq!(error_code(&o), 7);
        assert!(leases.join("10.0.0.2").exists());
    }

    #[test]
    fn test_add_with_the_agent_not_running_is_code_11_and_takes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let o = run_with(&add_vars(), &conf(tmp.path(), "1.1.0"));
        assert_eq!(error_code(&o), 11);
        nothing_done(tmp.path());
    }

    #[test]
    fn test_status_with_the_agent_not_running_is_code_51() {
        let tmp = tempfile::tempdir().unwrap();
        let o = run_with(&[("CNI_COMMAND", "STATUS")], &conf(tmp.path(), "1.1.0"));
        assert_eq!(error_code(&o), 51);
    }

    #[test]
    fn test_del_with_the_agent_not_running_releases_the_leases() {
        let tmp = tempfile::tempdir().unwrap();
        let leases = tmp.path().join("leases/ferry");
        std::fs::create_dir_all(&leases).unwrap();
        std::fs::write(leases.join("10.0.0.2"), "c1\r\neth0").unwrap();
        std::fs::write(leases.join("10.0.0.3"), "c2\r\neth0").unwrap();
        let vars = [
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
        ];
        let o = run_with(&vars, &conf(tmp.path(), "1.1.0"));
        assert!(o.success, "{o:?}");
        assert_eq!(o.stdout, None);
        assert_eq!(o.stderr.len(), 1, "{o:?}");
        assert!(o.stderr[0].contains("queued"), "{o:?}");
        assert!(!leases.join("10.0.0.2").exists());
        assert!(leases.join("10.0.0.3").exists());
        // The DEL waits for the agent next to its socket.
        let queue = tmp.path().join("agent.sock.del-queue");
        let entry = std::fs::read(queue.join("c1:eth0.json")).unwrap();
        let queued: Request = serde_json::from_slice(&entry).unwrap();
        assert_eq!(
            queued,
            Request::Del {
                container_id: "c1".into(),
                ifname: "eth0".into()
            }
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&queue).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // And again: nothing left is no error, and the DEL is queued once.
        assert!(run_with(&vars, &conf(tmp.path(), "1.1.0")).success);
        assert_eq!(std::fs::read_dir(&queue).unwrap().count(), 1);
    }

    #[test]
    fn test_del_with_no_agent_since_boot_queues_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let conf = json!({
            "cniVersion": "1.1.0",
            "name": "ferry",
            "type": "ferry-cni",
            "socket": tmp.path().join("run/ferry.sock"),
            "dataDir": tmp.path().join("leases"),
        })
        .to_string();
        let vars = [
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
        ];
        let o = run_with(&vars, &conf);
        assert!(o.success, "{o:?}");
        assert!(o.stderr[0].contains("has not run since"), "{o:?}");
        assert!(!tmp.path().join("run").exists());
    }

    #[test]
    fn test_del_that_cannot_be_queued_fails_and_keeps_the_leases() {
        let tmp = tempfile::tempdir().unwrap();
        let leases = tmp.path().join("leases/ferry");
        std::fs::create_dir_all(&leases).unwrap();
        std::fs::write(leases.join("10.0.0.2"), "c1\r\neth0").unwrap();
        // A file where the queue directory goes.
        std::fs::write(tmp.path().join("agent.sock.del-queue"), "").unwrap();
        let vars = [
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
        ];
        let o = run_with(&vars, &conf(tmp.path(), "1.1.0"));
        assert_eq!(error_code(&o), 5);
        assert!(leases.join("10.0.0.2").exists());
    }

    #[test]
    fn test_emit_prints_the_json_and_returns_the_status() {
        let o = Outcome {
            stdout: Some(json!({"code": 7})),
            stderr: vec!["careful".into()],
            success: false,
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(o.emit(&mut out, &mut err), 1);
        let printed: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(printed, json!({"code": 7}));
        assert_eq!(String::from_utf8(err).unwrap(), "ferry-cni: careful\n");
        let o = Outcome {
            stdout: None,
            stderr: vec![],
            success: true,
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(o.emit(&mut out, &mut err), 0);
        assert!(out.is_empty());
    }
}
