//! The case of loadbalancer.go: `loadBalancerSourceRanges` letting in the sources in
//! its ranges and no other.

use anyhow::Result;

use super::{Cond, HTTP_PORT, LB_IP, Scene, cluster_ip, endpoint, node_port, service, slice};

/// Upstream: an accepting and a dropping pod; ranges of the accepting pod's address,
/// then of the dropping pod's, then none.
pub(super) fn lb_source_ranges(s: &mut Scene) -> Result<()> {
    let plan = s.plan().clone();
    let one = s.server("server-1", s.far())?;
    let accept = s.pod_ip("client-1")?;
    let ip = cluster_ip(20);
    let np = node_port(20);
    let objects = |ranges: &str| {
        service(
            "ranged",
            "",
            &format!(
                "  type: LoadBalancer\n  clusterIP: {ip}\n  clusterIPs: [{ip}]\n{ranges}  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: {np} }}]\nstatus:\n  loadBalancer:\n    ingress: [{{ ip: {LB_IP}, ipMode: VIP }}]\n"
            ),
        ) + &slice(
            "ranged",
            "",
            HTTP_PORT,
            &[endpoint(&plan, &one, Cond::Ready, "")],
        )
    };
    let url = format!("http://{LB_IP}/hostname");
    let node1 = plan.node_ip(1);
    let ranges = |r: &[&str]| {
        let quoted: Vec<String> = r.iter().map(|r| format!("\"{r}\"")).collect();
        format!("  loadBalancerSourceRanges: [{}]\n", quoted.join(", "))
    };
    // The sources: the accepting pod, the dropping pod, a client outside the cluster
    // (through the load balancer, which routes the IP to node1 unchanged), and node1's
    // own stack (not upstream's: kubelet, host-network pods).
    let all = ["client-1", "client-2", "client", "node1"];
    let steps: [(String, &[&str]); 5] = [
        (String::new(), &all),
        (
            ranges(&[&format!("{accept}/32"), &format!("{node1}/32")]),
            &["client-1", "node1"],
        ),
        (ranges(&["0.0.0.0/1", "128.0.0.0/1"]), &all),
        (ranges(&["255.0.0.0/32"]), &[]),
        (String::new(), &all),
    ];
    for (r, allowed) in &steps {
        s.apply(&objects(r))?;
        for from in all {
            match allowed.contains(&from) {
                true => s.expect(from, &url, &one.id())?,
                false => {
                    s.expect_fail(from, &url, &[28])?;
                }
            }
        }
    }
    Ok(())
}
