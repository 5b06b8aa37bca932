//! The `CNI_*` environment variables: which command, for which container and
//! interface, and the runtime's extra arguments.

use ferry_api::PodRef;

use crate::error::{Error, code};

/// A CNI command (`CNI_COMMAND`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    /// Attach a container.
    Add,
    /// Detach it; succeeds when there is nothing to detach.
    Del,
    /// Check an attachment against the result of its ADD.
    Check,
    /// Whether the plugin can serve ADD.
    Status,
    /// Release what belongs to no valid attachment.
    Gc,
    /// The versions the plugin speaks.
    Version,
}

impl Command {
    /// The command named `s` (upper case, as the specification spells them).
    pub fn parse(s: &str) -> Option<Command> {
        Some(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "VERSION" => Command::Version,
            _ => return None,
        })
    }

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }

    /// The variables the specification requires for the command, besides
    /// `CNI_COMMAND`.
    fn required(self) -> &'static [&'static str] {
        match self {
            Command::Add | Command::Check => &[CONTAINER_ID, NETNS, IFNAME],
            Command::Del => &[CONTAINER_ID, IFNAME],
            Command::Gc => &[PATH],
            Command::Status | Command::Version => &[],
        }
    }
}

const COMMAND: &str = "CNI_COMMAND";
const CONTAINER_ID: &str = "CNI_CONTAINERID";
const NETNS: &str = "CNI_NETNS";
const IFNAME: &str = "CNI_IFNAME";
const ARGS: &str = "CNI_ARGS";
const PATH: &str = "CNI_PATH";

/// The environment of one invocation, checked for its command.
///
/// Variables the command does not use are kept as given and not checked: libcni sets
/// every variable on every call, empty where it has no value (GC and STATUS get an
/// empty `CNI_CONTAINERID`, for instance).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Environment {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID`; checked for ADD, DEL and CHECK.
    pub container_id: String,
    /// `CNI_NETNS`; an absolute path for ADD and CHECK, optional for DEL.
    pub netns: Option<String>,
    /// `CNI_IFNAME`; a valid Linux interface name for ADD, DEL and CHECK.
    pub ifname: String,
    /// `CNI_ARGS`, unparsed: only ADD reads it ([`pod_from_args`]).
    pub args: String,
    /// `CNI_PATH`: where other plugins are. ferry-cni delegates to none.
    pub path: Option<String>,
}

impl Environment {
    /// Reads and checks the variables through `var` (`std::env::var`, or a map in
    /// tests). Every missing variable is named at once.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Environment, Error> {
        let get = |name: &str| var(name).filter(|v| !v.is_empty());
        let command = match get(COMMAND) {
            None => {
                return Err(Error::new(
                    code::INVALID_ENVIRONMENT,
                    "CNI_COMMAND is not set",
                    "ferry-cni is a CNI plugin: the container runtime runs it with CNI_COMMAND \
                     set to ADD, DEL, CHECK, STATUS, GC or VERSION (or run `ferry-cni install`)",
                ));
            }
            Some(c) => Command::parse(&c).ok_or_else(|| {
                Error::new(
                    code::INVALID_ENVIRONMENT,
                    format!("CNI_COMMAND {c:?} is not a CNI command"),
                    "expected ADD, DEL, CHECK, STATUS, GC or VERSION",
                )
            })?,
        };
        let missing: Vec<&str> = command
            .required()
            .iter()
            .copied()
            .filter(|name| get(name).is_none())
            .collect();
        if !missing.is_empty() {
            return Err(Error::new(
                code::INVALID_ENVIRONMENT,
                format!(
                    "{} needs the environment variables {}",
                    command.as_str(),
                    missing.join(", ")
                ),
                "",
            ));
        }
        let env = Environment {
            command,
            container_id: get(CONTAINER_ID).unwrap_or_default(),
            netns: get(NETNS),
            ifname: get(IFNAME).unwrap_or_default(),
            args: get(ARGS).unwrap_or_default(),
            path: get(PATH),
        };
        if matches!(command, Command::Add | Command::Del | Command::Check) {
            check_container_id(&env.container_id)?;
            check_ifname(&env.ifname)?;
            if let Some(netns) = &env.netns {
                check_netns(netns)?;
            }
        }
        Ok(env)
    }

    /// The network namespace of ADD and CHECK (which [`Environment::from_vars`] made
    /// sure of).
    pub fn required_netns(&self) -> &str {
        self.netns.as_deref().unwrap_or_default()
    }
}

/// The specification's container ID: not empty, an alphanumeric first character, then
/// alphanumerics, `_`, `.` and `-`.
fn check_container_id(id: &str) -> Result<(), Error> {
    let mut chars = id.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        return Ok(());
    }
    Err(Error::new(
        code::INVALID_ENVIRONMENT,
        format!("CNI_CONTAINERID {id:?} is not a valid container ID"),
        "a container ID starts with a letter or digit, followed by letters, digits, '_', '.' \
         or '-'",
    ))
}

/// A name Linux takes for an interface, as the specification restates it: 1 to 15
/// bytes, not `.` or `..`, no `/`, `:` or white space.
fn check_ifname(name: &str) -> Result<(), Error> {
    let why = if name.len() > 15 {
        Some("longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("'.' and '..' are not interface names")
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        Some("'/', ':' and white space are not allowed")
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(Error::new(
            code::INVALID_ENVIRONMENT,
            format!("CNI_IFNAME {name:?} is not a valid interface name"),
            why,
        )),
    }
}

/// The agent opens the namespace by path, from another working directory: only an
/// absolute path means the same file there.
fn check_netns(netns: &str) -> Result<(), Error> {
    if netns.starts_with('/') {
        return Ok(());
    }
    Err(Error::new(
        code::INVALID_ENVIRONMENT,
        format!("CNI_NETNS {netns:?} is not an absolute path"),
        "expected a network namespace path such as /var/run/netns/NAME or /proc/PID/ns/net",
    ))
}

/// `CNI_ARGS`, `KEY=VALUE` pairs separated by `;`, in order. Empty pairs (a trailing
/// `;`) are skipped; a pair without `=` is an error.
pub fn parse_args(args: &str) -> Result<Vec<(&str, &str)>, Error> {
    args.split(';')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            pair.split_once('=').ok_or_else(|| {
                Error::new(
                    code::INVALID_ENVIRONMENT,
                    format!("CNI_ARGS has {pair:?}, which is not KEY=VALUE"),
                    format!("CNI_ARGS={args}"),
                )
            })
        })
        .collect()
}

/// The pod of an ADD, from `K8S_POD_NAMESPACE` and `K8S_POD_NAME` in `CNI_ARGS`.
///
/// Every other key is ignored, whether or not the runtime passed `IgnoreUnknown=1`:
/// kubelet and the container runtimes pass several (`K8S_POD_UID`,
/// `K8S_POD_INFRA_CONTAINER_ID`, ...) that the plugin has no use for. When a key
/// repeats, the last value counts.
pub fn pod_from_args(args: &str) -> Result<PodRef, Error> {
    let mut namespace = None;
    let mut name = None;
    for (key, value) in parse_args(args)? {
        match key {
            "K8S_POD_NAMESPACE" => namespace = Some(value),
            "K8S_POD_NAME" => name = Some(value),
            _ => {}
        }
    }
    match (
        namespace.filter(|v| !v.is_empty()),
        name.filter(|v| !v.is_empty()),
    ) {
        (Some(namespace), Some(name)) => Ok(PodRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }),
        _ => Err(Error::new(
            code::INVALID_ENVIRONMENT,
            "CNI_ARGS lacks K8S_POD_NAMESPACE or K8S_POD_NAME",
            "ferry attaches Kubernetes pods: the runtime must name the pod in CNI_ARGS \
             (K8S_POD_NAMESPACE=...;K8S_POD_NAME=...)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<Environment, Error> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Environment::from_vars(|k| map.get(k).cloned())
    }

    /// A good ADD environment with `changes` made (an empty value removes the variable).
    fn add_env(changes: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
        let mut v: Vec<(&'static str, String)> = vec![
            ("CNI_COMMAND", "ADD".into()),
            ("CNI_CONTAINERID", "abc123".into()),
            ("CNI_NETNS", "/var/run/netns/pod".into()),
            ("CNI_IFNAME", "eth0".into()),
            ("CNI_PATH", "/opt/cni/bin".into()),
        ];
        for (k, val) in changes {
            v.retain(|(key, _)| key != k);
            if !val.is_empty() {
                v.push((k, val.to_string()));
            }
        }
        v
    }

    fn env_of(v: &[(&'static str, String)]) -> Result<Environment, Error> {
        let pairs: Vec<(&str, &str)> = v.iter().map(|(k, v)| (*k, v.as_str())).collect();
        env(&pairs)
    }

    #[test]
    fn test_add_environment_is_read_whole() {
        let e = env_of(&add_env(&[("CNI_ARGS", "K8S_POD_NAME=web")])).unwrap();
        assert_eq!(
            e,
            Environment {
                command: Command::Add,
                container_id: "abc123".into(),
                netns: Some("/var/run/netns/pod".into()),
                ifname: "eth0".into(),
                args: "K8S_POD_NAME=web".into(),
                path: Some("/opt/cni/bin".into()),
            }
        );
    }

    #[test]
    fn test_missing_command_and_unknown_command_are_code_4() {
        let e = env(&[]).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
        assert!(e.msg.contains("CNI_COMMAND"), "{e}");
        let e = env(&[("CNI_COMMAND", "add")]).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
        assert!(e.msg.contains("\"add\""), "{e}");
        let e = env(&[("CNI_COMMAND", "INIT")]).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
    }

    #[test]
    fn test_every_missing_variable_is_named() {
        let e = env(&[("CNI_COMMAND", "ADD")]).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
        assert_eq!(
            e.msg,
            "ADD needs the environment variables CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME"
        );
        // Empty counts as missing: libcni sets unused variables to "".
        let e = env_of(&add_env(&[("CNI_IFNAME", "")])).unwrap_err();
        assert!(e.msg.ends_with("CNI_IFNAME"), "{e}");
        let e = env(&[("CNI_COMMAND", "CHECK"), ("CNI_CONTAINERID", "a")]).unwrap_err();
        assert!(e.msg.ends_with("CNI_NETNS, CNI_IFNAME"), "{e}");
        let e = env(&[("CNI_COMMAND", "GC")]).unwrap_err();
        assert!(e.msg.ends_with("CNI_PATH"), "{e}");
    }

    #[test]
    fn test_del_needs_no_netns_and_path() {
        let e = env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", ""),
        ])
        .unwrap();
        assert_eq!(e.netns, None);
        assert_eq!(e.path, None);
    }

    #[test]
    fn test_status_gc_and_version_ignore_the_attachment_variables() {
        for (command, extra) in [
            ("STATUS", None),
            ("VERSION", None),
            ("GC", Some(("CNI_PATH", "/opt/cni/bin"))),
        ] {
            let mut pairs = vec![
                ("CNI_COMMAND", command),
                ("CNI_CONTAINERID", ""),
                ("CNI_IFNAME", "not a valid name"),
                ("CNI_NETNS", "relative"),
            ];
            pairs.extend(extra);
            let e = env(&pairs).unwrap();
            assert_eq!(e.command.as_str(), command);
        }
    }

    #[test]
    fn test_container_ids_follow_the_spec() {
        for good in ["a", "0", "abc_def.g-h", "3f2a9c"] {
            assert!(check_container_id(good).is_ok(), "{good}");
        }
        for bad in ["", "_a", "-a", ".a", "a/b", "a b", "a:b", "é"] {
            let e = env_of(&add_env(&[("CNI_CONTAINERID", bad)]));
            if bad.is_empty() {
                assert!(e.unwrap_err().msg.contains("CNI_CONTAINERID"));
                continue;
            }
            let e = e.unwrap_err();
            assert_eq!(e.code, code::INVALID_ENVIRONMENT, "{bad}");
            assert!(e.msg.starts_with("CNI_CONTAINERID"), "{e}");
        }
    }

    #[test]
    fn test_interface_names_follow_linux_rules() {
        for good in ["eth0", "net1", "a", "x23456789012345"] {
            assert!(check_ifname(good).is_ok(), "{good}");
        }
        for bad in [".", "..", "a/b", "a:b", "a b", "a\tb", "x234567890123456"] {
            let e = env_of(&add_env(&[("CNI_IFNAME", bad)])).unwrap_err();
            assert_eq!(e.code, code::INVALID_ENVIRONMENT, "{bad}");
            assert!(e.msg.starts_with("CNI_IFNAME"), "{e}");
        }
    }

    #[test]
    fn test_netns_must_be_an_absolute_path() {
        let e = env_of(&add_env(&[("CNI_NETNS", "netns/pod")])).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
        assert!(e.msg.starts_with("CNI_NETNS"), "{e}");
        assert!(env_of(&add_env(&[("CNI_NETNS", "/proc/42/ns/net")])).is_ok());
    }

    #[test]
    fn test_args_are_key_value_pairs() {
        assert_eq!(parse_args("").unwrap(), []);
        assert_eq!(
            parse_args("A=1;B=x=y;;C=").unwrap(),
            [("A", "1"), ("B", "x=y"), ("C", "")]
        );
        let e = parse_args("A=1;oops").unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
        assert!(e.msg.contains("\"oops\""), "{e}");
    }

    #[test]
    fn test_pod_comes_from_k8s_args_and_unknown_keys_are_ignored() {
        let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-1;\
                    K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=1234;SOMETHING_ELSE=x";
        assert_eq!(
            pod_from_args(args).unwrap(),
            PodRef {
                namespace: "default".into(),
                name: "web-1".into()
            }
        );
        // Without IgnoreUnknown too.
        assert!(pod_from_args("FOO=bar;K8S_POD_NAMESPACE=a;K8S_POD_NAME=b").is_ok());
    }

    #[test]
    fn test_pod_without_namespace_or_name_is_code_4() {
        for args in [
            "",
            "K8S_POD_NAME=web",
            "K8S_POD_NAMESPACE=default",
            "K8S_POD_NAMESPACE=;K8S_POD_NAME=web",
        ] {
            let e = pod_from_args(args).unwrap_err();
            assert_eq!(e.code, code::INVALID_ENVIRONMENT, "{args}");
            assert!(e.msg.contains("CNI_ARGS"), "{e}");
        }
    }
}
