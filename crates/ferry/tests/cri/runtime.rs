//! containerd run by a test as a node's runtime, driven through the CRI API as kubelet
//! drives it: pod sandboxes whose networks containerd asks of the CNI plugin (with its
//! own `CNI_ARGS`, network namespaces, DELs and retries), and containers in them.
//!
//! Everything is the test's own: containerd's configuration, root, state, socket and
//! runc root are in the test's directory, and [`Runtime`]'s drop removes every sandbox it
//! made, stops containerd and its shims, and unmounts and deletes what they left (the
//! sandboxes' network namespaces included), also when the test fails.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::common::podman::Podman;

/// The image of sandboxes and containers: a static busybox with a page for its httpd.
/// (Its `wget -T` crashes: timeouts are busybox's `timeout`.)
pub const IMAGE: &str = "localhost/ferry-cri:test";

/// Builds [`IMAGE`] in `dir` (a busybox root file system imported into podman of the
/// test's own) and saves it as a docker archive; its path.
pub fn build_image(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::create_dir_all(root.join("www")).unwrap();
    fs::create_dir_all(root.join("etc")).unwrap();
    fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    for applet in [
        "sh", "sleep", "httpd", "wget", "ping", "cat", "ip", "timeout",
    ] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    fs::write(root.join("www/index.html"), "ferry-cri\n").unwrap();
    let tar = dir.join("rootfs.tar");
    crate::common::sh(&[
        "tar",
        "-C",
        root.to_str().unwrap(),
        "-cf",
        tar.to_str().unwrap(),
        ".",
    ]);
    fs::create_dir_all(dir.join("podman")).unwrap();
    let podman = Podman::new(&dir.join("podman"));
    podman.podman(&[
        "import",
        "--change",
        r#"CMD ["/bin/busybox", "sleep", "2147483647"]"#,
        "--change",
        "ENV PATH=/bin",
        tar.to_str().unwrap(),
        IMAGE,
    ]);
    let archive = dir.join("image.tar");
    podman.podman(&[
        "save",
        "--format",
        "docker-archive",
        "-o",
        archive.to_str().unwrap(),
        IMAGE,
    ]);
    archive
}

/// containerd with its CRI plugin, and a CRI client on its socket.
pub struct Runtime {
    dir: PathBuf,
    socket: PathBuf,
    child: Option<Child>,
    rt: tokio::runtime::Runtime,
    runtime: Option<RuntimeServiceClient<Channel>>,
    netns_before: Vec<String>,
}

/// containerd's configuration: the test's root, state, socket and runc root; the CNI
/// configuration and plugins from `cni_conf` and `cni_bin`; [`IMAGE`] as the sandbox
/// image; `restrict_oom_score_adj`, since runc cannot lower a process's oom_score_adj
/// on these machines.
fn config(dir: &Path, cni_conf: &Path, cni_bin: &Path) -> String {
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{runc}"
"#,
        root = dir.join("root").display(),
        state = dir.join("state").display(),
        socket = dir.join("containerd.sock").display(),
        runc = dir.join("runc").display(),
        bin = cni_bin.display(),
        conf = cni_conf.display(),
    )
}

/// The network namespaces named in /var/run/netns.
fn netns_names() -> Vec<String> {
    fs::read_dir("/var/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

impl Runtime {
    /// Starts containerd in `dir` (made if missing) with the CNI configuration in
    /// `cni_conf` and the plugins in `cni_bin`, imports the image archive `image`, and
    /// waits until its runtime and network are ready.
    pub fn start(dir: &Path, cni_conf: &Path, cni_bin: &Path, image: &Path) -> Runtime {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join("config.toml"), config(dir, cni_conf, cni_bin)).unwrap();
        let mut r = Runtime {
            dir: dir.to_path_buf(),
            socket: dir.join("containerd.sock"),
            child: None,
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            runtime: None,
            netns_before: netns_names(),
        };
        r.restart();
        crate::common::sh(&[
            "ctr",
            "--address",
            r.socket.to_str().unwrap(),
            "-n",
            "k8s.io",
            "images",
            "import",
            image.to_str().unwrap(),
        ]);
        r
    }

    /// containerd's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// Stops containerd (SIGKILL, as a crash would; the shims and their sandboxes go on)
    /// if it runs, starts it again and waits until it answers with its runtime and
    /// network ready.
    pub fn restart(&mut self) {
        self.kill();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("containerd.log"))
            .unwrap();
        self.child = Some(
            Command::new("containerd")
                .arg("--config")
                .arg(self.dir.join("config.toml"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("containerd"),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(client) = self.connect() {
                self.runtime = Some(client);
                if let Ok(s) = self.block(|mut c| async move {
                    c.status(cri::StatusRequest { verbose: false }).await
                }) {
                    let conditions = s.status.map(|s| s.conditions).unwrap_or_default();
                    let ready = |t: &str| conditions.iter().any(|c| c.r#type == t && c.status);
                    if ready("RuntimeReady") && ready("NetworkReady") {
                        return;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "containerd did not become ready:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A client of containerd's socket, once it answers.
    fn connect(&self) -> Option<RuntimeServiceClient<Channel>> {
        if !self.socket.exists() {
            return None;
        }
        let socket = self.socket.clone();
        let channel = self
            .rt
            .block_on(
                Endpoint::from_static("http://[::]:50051").connect_with_connector(
                    tower::service_fn(move |_: Uri| {
                        let socket = socket.clone();
                        async move {
                            Ok::<_, std::io::Error>(TokioIo::new(
                                tokio::net::UnixStream::connect(socket).await?,
                            ))
                        }
                    }),
                ),
            )
            .ok()?;
        Some(RuntimeServiceClient::new(channel))
    }

    /// Runs `f` on the runtime service client.
    fn block<T, F>(
        &self,
        f: impl FnOnce(RuntimeServiceClient<Channel>) -> F,
    ) -> Result<T, tonic::Status>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.runtime.clone().expect("a client of containerd");
        self.rt.block_on(f(client)).map(tonic::Response::into_inner)
    }

    /// The configuration of sandbox `namespace/name`.
    fn sandbox_config(&self, namespace: &str, name: &str) -> cri::PodSandboxConfig {
        let logs = self.dir.join("logs").join(format!("{namespace}_{name}"));
        fs::create_dir_all(&logs).unwrap();
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{namespace}-{name}"),
                namespace: namespace.into(),
                attempt: 0,
            }),
            hostname: name.into(),
            log_directory: logs.display().to_string(),
            linux: Some(cri::LinuxPodSandboxConfig::default()),
            ..Default::default()
        }
    }

    /// RunPodSandbox for pod `namespace/name`: its sandbox's ID, or containerd's error.
    pub fn run_sandbox(&self, namespace: &str, name: &str) -> Result<String, tonic::Status> {
        let config = self.sandbox_config(namespace, name);
        self.block(|mut c| async move {
            c.run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
        })
        .map(|r| r.pod_sandbox_id)
    }

    /// PodSandboxStatus: whether it is ready, and its addresses (the first is `ip`).
    pub fn sandbox(&self, id: &str) -> (bool, Vec<String>) {
        let id = id.to_string();
        let s = self
            .block(|mut c| async move {
                c.pod_sandbox_status(cri::PodSandboxStatusRequest {
                    pod_sandbox_id: id,
                    verbose: false,
                })
                .await
            })
            .expect("PodSandboxStatus")
            .status
            .expect("a sandbox status");
        let ips = s
            .network
            .map(|n| {
                std::iter::once(n.ip)
                    .chain(n.additional_ips.into_iter().map(|p| p.ip))
                    .filter(|ip| !ip.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        (s.state == cri::PodSandboxState::SandboxReady as i32, ips)
    }

    /// The IDs of the sandboxes containerd knows.
    pub fn sandboxes(&self) -> Vec<String> {
        self.block(|mut c| async move {
            c.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
                .await
        })
        .map(|r| r.items.into_iter().map(|s| s.id).collect())
        .unwrap_or_default()
    }

    /// StopPodSandbox.
    pub fn stop_sandbox(&self, id: &str) -> Result<(), tonic::Status> {
        let id = id.to_string();
        self.block(|mut c| async move {
            c.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: id })
                .await
        })
        .map(drop)
    }

    /// RemovePodSandbox.
    pub fn remove_sandbox(&self, id: &str) -> Result<(), tonic::Status> {
        let id = id.to_string();
        self.block(|mut c| async move {
            c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
                .await
        })
        .map(drop)
    }

    /// CreateContainer and StartContainer: container `name` running `command` in
    /// sandbox `sandbox` (of pod `namespace/pod`); its ID.
    pub fn run_container(
        &self,
        sandbox: &str,
        (namespace, pod): (&str, &str),
        name: &str,
        command: &[&str],
    ) -> String {
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.to_string(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: name.into(),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: IMAGE.into(),
                    ..Default::default()
                }),
                command: command.iter().map(|s| s.to_string()).collect(),
                log_path: format!("{name}.log"),
                linux: Some(cri::LinuxContainerConfig::default()),
                ..Default::default()
            }),
            sandbox_config: Some(self.sandbox_config(namespace, pod)),
        };
        let id = self
            .block(|mut c| async move { c.create_container(request).await })
            .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}"))
            .container_id;
        let start = id.clone();
        self.block(|mut c| async move {
            c.start_container(cri::StartContainerRequest {
                container_id: start,
            })
            .await
        })
        .unwrap_or_else(|e| panic!("StartContainer {name}: {e}"));
        id
    }

    /// ExecSync `cmd` in container `id` (10 s at most): its exit code and output.
    pub fn exec(&self, id: &str, cmd: &[&str]) -> (i32, String) {
        let request = cri::ExecSyncRequest {
            container_id: id.to_string(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 10,
        };
        let r = self
            .block(|mut c| async move { c.exec_sync(request).await })
            .unwrap_or_else(|e| panic!("ExecSync {cmd:?}: {e}"));
        (
            r.exit_code,
            format!(
                "{}{}",
                String::from_utf8_lossy(&r.stdout),
                String::from_utf8_lossy(&r.stderr)
            ),
        )
    }

    /// Kills containerd if it runs.
    fn kill(&mut self) {
        self.runtime = None;
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // As kubelet would: every sandbox stopped and removed (its containers, mounts and
        // network namespace with it, the CNI DEL made).
        if self.runtime.is_some() {
            for id in self.sandboxes() {
                let _ = self.stop_sandbox(&id);
                let _ = self.remove_sandbox(&id);
            }
        }
        self.kill();
        // What a failure midway may have left: containers, shims, mounts, namespaces.
        let runc = self.dir.join("runc");
        if let Ok(out) = Command::new("runc")
            .arg("--root")
            .arg(&runc)
            .args(["list", "-q"])
            .output()
        {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(&runc)
                    .args(["delete", "-f", id])
                    .output();
            }
        }
        let _ = Command::new("pkill")
            .args(["-KILL", "-f"])
            .arg(format!(
                "containerd-shim.* -address {}",
                self.socket.display()
            ))
            .output();
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mut under: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|m| Path::new(m).starts_with(&self.dir))
            .collect();
        under.reverse();
        for m in under {
            let _ = Command::new("umount").args(["-l", m]).output();
        }
        for ns in netns_names() {
            if ns.starts_with("cni-") && !self.netns_before.contains(&ns) {
                let _ = Command::new("ip").args(["netns", "delete", &ns]).output();
            }
        }
    }
}
