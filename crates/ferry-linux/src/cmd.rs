//! The one runner of external commands: `ip`, `tc` and `nft` for the set-up steps that
//! are rare and off the packet path (interfaces, the ingress filter, host NAT, reading
//! routes and rule sets), and the tools the lab drives.
//!
//! A [`Cmd`] is a program with its arguments, optionally bytes for its standard input and
//! a network namespace to run in (through `ip netns exec`). [`Cmd::run`] captures what it
//! prints and, when it cannot be started or does not succeed, returns an [`Error`] that
//! names the command line, its exit status and what it said on standard error.

use std::fmt;
use std::io::{self, Write as _};
use std::process::{Command, ExitStatus, Output, Stdio};

/// A command to run.
#[derive(Clone, Debug, Default)]
pub struct Cmd {
    program: String,
    args: Vec<String>,
    stdin: Option<Vec<u8>>,
    netns: Option<String>,
}

impl Cmd {
    /// `program`, without arguments yet.
    pub fn new(program: impl Into<String>) -> Cmd {
        Cmd {
            program: program.into(),
            ..Cmd::default()
        }
    }

    /// Adds one argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Cmd {
        self.args.push(arg.into());
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_string()));
        self
    }

    /// Gives `input` on standard input (otherwise it reads nothing).
    pub fn stdin(mut self, input: impl Into<Vec<u8>>) -> Cmd {
        self.stdin = Some(input.into());
        self
    }

    /// Runs it in network namespace `ns` (an `ip netns` name), as `ip netns exec ns ...`.
    pub fn netns(mut self, ns: impl Into<String>) -> Cmd {
        self.netns = Some(ns.into());
        self
    }

    /// The command line as it runs (`ip netns exec ns nft -f -`), for messages; arguments
    /// that are empty or hold spaces or quotes are quoted as a shell would need them.
    pub fn line(&self) -> String {
        let mut words: Vec<&str> = Vec::new();
        if let Some(ns) = &self.netns {
            words.extend(["ip", "netns", "exec", ns]);
        }
        words.push(&self.program);
        words.extend(self.args.iter().map(String::as_str));
        words.into_iter().map(quote).collect::<Vec<_>>().join(" ")
    }

    /// The process to start, for callers that handle its streams themselves (a process
    /// left running, an interactive one): program, arguments and namespace set, nothing
    /// else.
    pub fn command(&self) -> Command {
        let mut c = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, &self.program]);
                c
            }
            None => Command::new(&self.program),
        };
        c.args(&self.args);
        c
    }

    /// Runs it to the end and returns its output, whatever its exit status; an error
    /// only when it cannot be started or its standard input or output fail.
    pub fn output(&self) -> Result<Output, Error> {
        self.finish().map(|(out, _)| out)
    }

    /// Runs it to the end and returns its standard output; an error unless it exits
    /// with status 0.
    pub fn run(&self) -> Result<String, Error> {
        let (out, fed) = self.finish()?;
        if !out.status.success() {
            return Err(self.error(Failure::Exit {
                status: out.status,
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            }));
        }
        // A command that succeeded without reading all its input still had it cut short.
        fed.map_err(|e| self.error(Failure::Io(e)))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs it to the end: its output, and how feeding its standard input went (a
    /// command that fails may stop reading early, which [`Cmd::run`] then does not
    /// report over its exit status).
    fn finish(&self) -> Result<(Output, io::Result<()>), Error> {
        let mut c = self.command();
        c.stdin(if self.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = c.spawn().map_err(|e| self.error(Failure::Start(e)))?;
        let (Some(input), Some(mut pipe)) = (&self.stdin, child.stdin.take()) else {
            let out = child
                .wait_with_output()
                .map_err(|e| self.error(Failure::Io(e)))?;
            return Ok((out, Ok(())));
        };
        // Input is written from a thread of its own while the output is read: a command
        // that prints much before reading all of it would otherwise wait on us forever.
        let (fed, out) = std::thread::scope(|s| {
            let writer = s.spawn(move || pipe.write_all(input));
            let out = child.wait_with_output();
            let fed = writer
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("writer thread panicked")));
            (fed, out)
        });
        let out = out.map_err(|e| self.error(Failure::Io(e)))?;
        Ok((out, fed))
    }

    fn error(&self, failure: Failure) -> Error {
        Error {
            line: self.line(),
            program: if self.netns.is_some() {
                "ip".to_string()
            } else {
                self.program.clone()
            },
            failure,
        }
    }
}

/// Runs `program args...` and returns its standard output (see [`Cmd::run`]).
pub fn run(program: &str, args: &[&str]) -> Result<String, Error> {
    Cmd::new(program).args(args).run()
}

/// A word of a command line as a shell would read it back.
fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && !word
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '\'' | '"' | '\\' | '$' | '`'));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The package that holds `program`, for the message when it is missing.
fn package(program: &str) -> Option<&'static str> {
    match program {
        "ip" | "tc" | "bridge" => Some("iproute2"),
        "nft" => Some("nftables"),
        p if p.starts_with("iptables") || p.starts_with("ip6tables") => Some("iptables"),
        _ => None,
    }
}

/// A command that could not be run or did not succeed.
#[derive(Debug)]
pub struct Error {
    line: String,
    /// The program started (`ip` for one run in a namespace).
    program: String,
    failure: Failure,
}

/// How a command failed.
#[derive(Debug)]
pub enum Failure {
    /// It could not be started (most often: it is not installed).
    Start(io::Error),
    /// Feeding its standard input or reading its output failed.
    Io(io::Error),
    /// It ran and did not exit with status 0 (or was killed by a signal).
    Exit {
        /// How it ended.
        status: ExitStatus,
        /// What it printed on standard output.
        stdout: String,
        /// What it printed on standard error.
        stderr: String,
    },
}

impl Error {
    /// The command line (see [`Cmd::line`]).
    pub fn line(&self) -> &str {
        &self.line
    }

    /// How it failed.
    pub fn failure(&self) -> &Failure {
        &self.failure
    }

    /// True when its program is not installed.
    pub fn is_not_found(&self) -> bool {
        matches!(&self.failure, Failure::Start(e) if e.kind() == io::ErrorKind::NotFound)
    }

    /// Its exit status, when it ran to the end.
    pub fn status(&self) -> Option<ExitStatus> {
        match &self.failure {
            Failure::Exit { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// What it printed on standard error, when it ran to the end.
    pub fn stderr(&self) -> Option<&str> {
        match &self.failure {
            Failure::Exit { stderr, .. } => Some(stderr),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.failure {
            Failure::Start(e) => {
                write!(f, "cannot run `{}`", self.line)?;
                if let Some(p) = package(&self.program) {
                    write!(f, " (install package {p})")?;
                }
                write!(f, ": {e}")
            }
            Failure::Io(e) => write!(f, "running `{}`: {e}", self.line),
            Failure::Exit {
                status,
                stdout,
                stderr,
            } => {
                write!(f, "`{}` failed ({status})", self.line)?;
                // Standard error says why; standard output too, for the commands that
                // print their complaints there.
                let said: Vec<&str> = [stderr.trim(), stdout.trim()]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect();
                if !said.is_empty() {
                    write!(f, ": {}", said.join("\n"))?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.failure {
            Failure::Start(e) | Failure::Io(e) => Some(e),
            Failure::Exit { .. } => None,
        }
    }
}

/// For callers that report `io::Error`s: the kind of the underlying error (`NotFound` for
/// a missing program), else `Other`; the message is the error's.
impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e.failure {
            Failure::Start(io) | Failure::Io(io) => io.kind(),
            Failure::Exit { .. } => io::ErrorKind::Other,
        };
        io::Error::new(kind, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_line_names_the_namespace_and_quotes_what_needs_it() {
        let c = Cmd::new("nft")
            .args(["-f", "-"])
            .arg("a b")
            .arg("")
            .arg("it's")
            .netns("lab-lb");
        assert_eq!(
            c.line(),
            r"ip netns exec lab-lb nft -f - 'a b' '' 'it'\''s'"
        );
        assert_eq!(Cmd::new("ip").args(["link", "show"]).line(), "ip link show");
    }

    #[test]
    fn test_run_returns_standard_output() {
        assert_eq!(run("echo", &["one", "two"]).unwrap(), "one two\n");
    }

    #[test]
    fn test_standard_input_is_given_and_otherwise_empty() {
        let out = Cmd::new("cat").stdin("script\n").run().unwrap();
        assert_eq!(out, "script\n");
        assert_eq!(Cmd::new("cat").run().unwrap(), "");
        // More than a pipe holds, echoed back while it is written.
        let big = "x".repeat(1 << 20);
        assert_eq!(Cmd::new("cat").stdin(big.clone()).run().unwrap(), big);
    }

    #[test]
    fn test_a_failure_names_the_line_the_status_and_standard_error() {
        let e = Cmd::new("sh")
            .args(["-c", "echo out; echo why >&2; exit 3"])
            .run()
            .unwrap_err();
        assert_eq!(e.status().and_then(|s| s.code()), Some(3));
        assert_eq!(e.stderr(), Some("why\n"));
        assert_eq!(
            e.to_string(),
            "`sh -c 'echo out; echo why >&2; exit 3'` failed (exit status: 3): why\nout"
        );
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::Other);
    }

    /// Needs root: makes a network namespace.
    #[test]
    fn test_a_command_runs_in_its_namespace_with_its_input() {
        let ns = format!("ferry-cmd-{}", std::process::id());
        run("ip", &["netns", "add", &ns]).unwrap();
        let links = Cmd::new("ip").args(["-o", "link", "show"]).netns(&ns).run();
        let fed = Cmd::new("cat").netns(&ns).stdin("in the namespace").run();
        let missing = Cmd::new("no-such-program").netns(&ns).run();
        let _ = run("ip", &["netns", "delete", &ns]);
        // A new namespace has its loopback alone.
        assert_eq!(links.unwrap().lines().count(), 1);
        assert_eq!(fed.unwrap(), "in the namespace");
        let e = missing.unwrap_err();
        assert!(e.status().is_some(), "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("`ip netns exec {ns} no-such-program` failed")),
            "{e}"
        );
    }

    #[test]
    fn test_output_gives_a_failed_run_without_an_error() {
        let out = Cmd::new("sh").args(["-c", "exit 2"]).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
    }

    #[test]
    fn test_a_missing_program_is_not_found_and_names_its_package() {
        let e = Cmd::new("nft-not-installed").run().unwrap_err();
        assert!(matches!(e.failure(), Failure::Start(_)));
        assert!(
            e.to_string()
                .starts_with("cannot run `nft-not-installed`: "),
            "{e}"
        );
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::NotFound);
        let e = Error {
            line: "tc qdisc show".into(),
            program: "tc".into(),
            failure: Failure::Start(io::ErrorKind::NotFound.into()),
        };
        assert_eq!(
            e.to_string(),
            "cannot run `tc qdisc show` (install package iproute2): entity not found"
        );
    }
}
