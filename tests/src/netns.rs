//! Network namespaces for a cluster, and the partitions and packet loss the
//! nemesis makes between them (root only).
//!
//! Layout: one "switch" namespace holds a bridge `br0`; each node has its own
//! namespace whose `eth0` is one end of a veth pair, the other end (`pI`)
//! being a port of the bridge. Nodes get `10.213.0.(10+I)/24`: an address
//! range that exists only inside these namespaces, and nothing else is ever
//! dialled. Nothing is created in the host's namespace.
//!
//! Faults are `tc` rules on the bridge ports, in the switch namespace. The
//! kernel here has neither `netem` nor the `gact` drop action, and nftables'
//! command-line tool is not installed, so a drop is built from what exists:
//! every port's egress has an HTB root whose default class passes traffic and
//! whose class `1:2` ends in a `pfifo limit 0` (a queue that takes nothing,
//! so whatever is classified there is dropped). Then
//! - a partition is a set of `u32` filters on port J's egress matching
//!   `ip src` of every node not on J's side (all traffic to node J leaves
//!   the bridge through port J, so this cuts exactly the cross-side pairs);
//! - random loss is a classic-BPF `cls_bpf` filter on every port that loads
//!   the kernel's per-packet random number (`ld rand`) and classifies into
//!   the drop class below a threshold.
//!
//! Namespaces are named `meshchaos-<pid>-<k>-<role>`: [`Netns`] deletes its
//! own on drop, and [`remove_stale`] deletes those left by a run whose
//! process is gone (and kills what still runs inside them: daemons an earlier
//! run of this harness started).

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, bail};

/// Every namespace this harness makes starts with this.
pub const NS_PREFIX: &str = "meshchaos-";

/// The first three octets of the nodes' addresses (inside the namespaces only).
pub const SUBNET_PREFIX: [u8; 3] = [10, 213, 0];

/// The last octet of node 0's address; node I has `NODE_HOST_BASE + I`.
pub const NODE_HOST_BASE: u8 = 10;

/// The most nodes one set of namespaces holds.
pub const NODES_MAX: usize = 32;

/// The `tc` filter priority of partition rules.
const PRIO_PARTITION: &str = "10";
/// The `tc` filter priority of random-loss rules.
const PRIO_LOSS: &str = "20";
/// The `tc` filter priority of the cuts between two nodes.
const PRIO_CUT: &str = "30";

/// Namespace sets made by this process so far (names stay unique).
static NEXT_SET: AtomicU32 = AtomicU32::new(0);

/// Whether this process runs as root.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Why namespaces cannot be used here, or `None` if they can.
pub fn unavailable_reason() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("not running as root".into());
    }
    for tool in ["ip", "tc"] {
        let found = Command::new(tool)
            .arg("-V")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            return Some(format!("`{tool}` (iproute2) is not installed"));
        }
    }
    None
}

/// A switch namespace with a bridge and one namespace per node.
#[derive(Debug)]
pub struct Netns {
    switch: String,
    nodes: Vec<String>,
    /// Each node's address now (moved ones differ from their first).
    ips: Vec<Ipv4Addr>,
    destroyed: bool,
}

impl Netns {
    /// Removes stale namespaces of earlier runs, then creates a switch and
    /// `n` node namespaces wired to its bridge, with a drop class on each port.
    ///
    /// # Errors
    /// If not root, if `n` is 0 or above [`NODES_MAX`], or if an `ip`/`tc`
    /// command fails (whatever was made is removed again).
    pub fn create(n: usize) -> anyhow::Result<Netns> {
        if let Some(why) = unavailable_reason() {
            bail!("network namespaces are unavailable: {why}");
        }
        if n == 0 || n > NODES_MAX {
            bail!("a namespace set holds 1 to {NODES_MAX} nodes, not {n}");
        }
        remove_stale()?;
        let set = NEXT_SET.fetch_add(1, Ordering::Relaxed);
        let base = format!("{NS_PREFIX}{}-{set}", std::process::id());
        let [a, b, c] = SUBNET_PREFIX;
        let mut ns = Netns {
            switch: format!("{base}-sw"),
            nodes: (0..n).map(|i| format!("{base}-n{i}")).collect(),
            ips: (0..n)
                .map(|i| Ipv4Addr::new(a, b, c, NODE_HOST_BASE + i as u8))
                .collect(),
            destroyed: false,
        };
        // On error, `ns` is dropped and removes what was made.
        ns.build()?;
        Ok(ns)
    }

    fn build(&mut self) -> anyhow::Result<()> {
        let sw = self.switch.clone();
        ip(&["netns", "add", &sw])?;
        ip(&["-n", &sw, "link", "set", "lo", "up"])?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for i in 0..self.nodes.len() {
            let node = self.nodes[i].clone();
            let port = port_name(i);
            let addr = format!("{}/24", self.node_ip(i));
            ip(&["netns", "add", &node])?;
            ip(&["-n", &node, "link", "set", "lo", "up"])?;
            ip(&[
                "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &node,
            ])?;
            ip(&["-n", &node, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", &node, "link", "set", "eth0", "up"])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", &port, "up"])?;
            // The drop class: see the module doc.
            tc(
                &sw,
                &[
                    "qdisc", "add", "dev", &port, "root", "handle", "1:", "htb", "default", "1",
                ],
            )?;
            for class in ["1:1", "1:2"] {
                tc(
                    &sw,
                    &[
                        "class", "add", "dev", &port, "parent", "1:", "classid", class, "htb",
                        "rate", "10gbit", "quantum", "60000",
                    ],
                )?;
            }
            tc(
                &sw,
                &[
                    "qdisc", "add", "dev", &port, "parent", "1:2", "handle", "2:", "pfifo",
                    "limit", "0",
                ],
            )?;
        }
        Ok(())
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no nodes (never, once created).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The switch namespace's name.
    pub fn switch(&self) -> &str {
        &self.switch
    }

    /// Node `i`'s namespace name.
    pub fn node_ns(&self, i: usize) -> &str {
        &self.nodes[i]
    }

    /// Node `i`'s address now, valid inside the namespaces only.
    pub fn node_ip(&self, i: usize) -> Ipv4Addr {
        self.ips[i]
    }

    /// Moves node `i` to the address `10.213.0.host` (as DHCP would after a
    /// reboot): its old address is gone from its interface.
    ///
    /// # Errors
    /// If `host` is some other node's, or an `ip` command fails.
    pub fn move_node(&mut self, i: usize, host: u8) -> anyhow::Result<Ipv4Addr> {
        let [a, b, c] = SUBNET_PREFIX;
        let ip = Ipv4Addr::new(a, b, c, host);
        if self.ips.iter().enumerate().any(|(k, x)| k != i && *x == ip) {
            bail!("{ip} is node {i}'s neighbour's address");
        }
        let ns = self.nodes[i].clone();
        ip_cmd(&["-n", &ns, "addr", "flush", "dev", "eth0"])?;
        ip_cmd(&["-n", &ns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        self.ips[i] = ip;
        Ok(ip)
    }

    /// Lets multicast through: a route for 224.0.0.0/4 on every node's
    /// `eth0`, and no multicast snooping on the bridge (which would hold
    /// back groups no querier announced). For mDNS, inside these
    /// namespaces only.
    ///
    /// # Errors
    /// If an `ip` command fails.
    pub fn enable_multicast(&self) -> anyhow::Result<()> {
        ip_cmd(&[
            "-n",
            &self.switch,
            "link",
            "set",
            "br0",
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ])?;
        for ns in &self.nodes {
            ip_cmd(&["-n", ns, "link", "set", "eth0", "multicast", "on"])?;
            ip_cmd(&["-n", ns, "route", "add", "224.0.0.0/4", "dev", "eth0"])?;
        }
        Ok(())
    }

    /// Cuts nodes `i` and `j` off from each other only (every other pair
    /// still talks): drops what either sends the other, by source address.
    ///
    /// # Errors
    /// If a `tc` command fails.
    pub fn cut_pair(&self, i: usize, j: usize) -> anyhow::Result<()> {
        for (from, to) in [(i, j), (j, i)] {
            self.drop_from(from, to, PRIO_CUT)?;
        }
        Ok(())
    }

    /// Runs `f` on a thread inside node `i`'s namespace (sockets it makes
    /// stay there, whichever thread uses them later) and answers its result.
    ///
    /// # Errors
    /// If the namespace cannot be entered.
    pub fn run_in<T: Send + 'static>(
        &self,
        i: usize,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> anyhow::Result<T> {
        run_in_namespace(&self.nodes[i], f)
    }

    /// Cuts the network into `sides`: nodes on different sides (a node on
    /// no side is alone) cannot reach each other; replaces any earlier
    /// partition, leaves random loss as it is.
    ///
    /// # Errors
    /// If a `tc` command fails.
    pub fn partition(&self, sides: &[Vec<usize>]) -> anyhow::Result<()> {
        self.clear(PRIO_PARTITION)?;
        let side_of = |i: usize| sides.iter().position(|s| s.contains(&i));
        for j in 0..self.nodes.len() {
            for k in 0..self.nodes.len() {
                let apart = k != j && (side_of(k).is_none() || side_of(k) != side_of(j));
                if !apart {
                    continue;
                }
                self.drop_from(k, j, PRIO_PARTITION)?;
            }
        }
        Ok(())
    }

    /// Cuts node `i` off from every other node.
    ///
    /// # Errors
    /// If a `tc` command fails.
    pub fn isolate(&self, i: usize) -> anyhow::Result<()> {
        let rest: Vec<usize> = (0..self.nodes.len()).filter(|&k| k != i).collect();
        self.partition(&[vec![i], rest])
    }

    /// Drops `percent` % of the packets leaving every bridge port, at
    /// random; 0 removes the loss. Leaves partitions as they are.
    ///
    /// # Errors
    /// If `percent` is above 100 or a `tc` command fails.
    pub fn loss(&self, percent: u32) -> anyhow::Result<()> {
        if percent > 100 {
            bail!("loss is a percentage, not {percent}");
        }
        self.clear(PRIO_LOSS)?;
        if percent == 0 {
            return Ok(());
        }
        let program = loss_bytecode(percent);
        for j in 0..self.nodes.len() {
            let port = port_name(j);
            tc(
                &self.switch,
                &[
                    "filter", "add", "dev", &port, "parent", "1:", "protocol", "ip", "prio",
                    PRIO_LOSS, "bpf", "bytecode", &program, "flowid", "1:2",
                ],
            )?;
        }
        Ok(())
    }

    /// Removes every partition and all loss.
    ///
    /// # Errors
    /// If a `tc` command fails.
    pub fn heal(&self) -> anyhow::Result<()> {
        self.clear(PRIO_PARTITION)?;
        self.clear(PRIO_CUT)?;
        self.clear(PRIO_LOSS)
    }

    /// Drops every packet from node `from` to node `to` at `to`'s bridge
    /// port, by source address, as a filter of priority `prio`.
    fn drop_from(&self, from: usize, to: usize, prio: &str) -> anyhow::Result<()> {
        let src = format!("{}/32", self.node_ip(from));
        tc(
            &self.switch,
            &[
                "filter",
                "add",
                "dev",
                &port_name(to),
                "parent",
                "1:",
                "protocol",
                "ip",
                "prio",
                prio,
                "u32",
                "match",
                "ip",
                "src",
                &src,
                "flowid",
                "1:2",
            ],
        )
    }

    /// Removes the filters of priority `prio` from every port.
    fn clear(&self, prio: &str) -> anyhow::Result<()> {
        for j in 0..self.nodes.len() {
            let port = port_name(j);
            let listed = tc_output(
                &self.switch,
                &["filter", "show", "dev", &port, "parent", "1:", "prio", prio],
            )?;
            if listed.trim().is_empty() {
                continue;
            }
            tc(
                &self.switch,
                &["filter", "del", "dev", &port, "parent", "1:", "prio", prio],
            )?;
        }
        Ok(())
    }

    /// Packets dropped by the drop class of node `i`'s port so far.
    ///
    /// # Errors
    /// If `tc` fails or prints something unexpected.
    pub fn dropped(&self, i: usize) -> anyhow::Result<u64> {
        let port = port_name(i);
        let text = tc_output(&self.switch, &["-s", "qdisc", "show", "dev", &port])?;
        // "qdisc pfifo 2: parent 1:2 limit 0p\n Sent .. (dropped N, ..."
        let pfifo = text
            .split("qdisc ")
            .find(|q| q.starts_with("pfifo 2:"))
            .context("no drop queue on the port")?;
        let n = pfifo
            .split("dropped ")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .context("no drop count in tc's output")?;
        n.trim()
            .parse()
            .with_context(|| format!("bad drop count {n:?}"))
    }

    /// Deletes every namespace of the set (running processes inside are
    /// not killed: the cluster stops its daemons first).
    ///
    /// # Errors
    /// If a namespace cannot be deleted; the others are still tried.
    pub fn destroy(&mut self) -> anyhow::Result<()> {
        if self.destroyed {
            return Ok(());
        }
        self.destroyed = true;
        let mut first_err = None;
        for ns in self.nodes.iter().chain(std::iter::once(&self.switch)) {
            if !list_namespaces()?.contains(ns) {
                continue;
            }
            if let Err(e) = ip(&["netns", "del", ns]) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = self.destroy() {
            eprintln!("chaos: cannot remove namespaces {}: {e:#}", self.switch);
        }
    }
}

/// The bridge port name of node `i` (inside the switch namespace).
fn port_name(i: usize) -> String {
    format!("p{i}")
}

/// The classic-BPF program (in `tc`'s `bytecode` syntax) that matches a
/// packet with probability `percent` %: `ld rand; jgt T, 0, 1; ret -1; ret 0`.
/// A match (-1) takes the filter's flow id, the drop class.
pub fn loss_bytecode(percent: u32) -> String {
    // SKF_AD_OFF (-0x1000) + SKF_AD_RANDOM (56), as the unsigned `k` field.
    const LD_RAND_K: u32 = 0xFFFF_F038;
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JMP_JGT_K: u16 = 0x25;
    const BPF_RET_K: u16 = 0x06;
    let keep = u64::from(100 - percent.min(100));
    // Packets whose random value is above `threshold` are dropped.
    let threshold = ((keep << 32) / 100).min(u64::from(u32::MAX)) as u32;
    format!(
        "4,{BPF_LD_W_ABS} 0 0 {LD_RAND_K},{BPF_JMP_JGT_K} 0 1 {threshold},{BPF_RET_K} 0 0 {},{BPF_RET_K} 0 0 0",
        u32::MAX
    )
}

/// Namespace names this machine has.
pub fn list_namespaces() -> anyhow::Result<Vec<String>> {
    let out = run("ip", &["netns", "list"])?;
    // Lines look like "name" or "name (id: 3)".
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

/// Deletes namespaces named by this harness whose creating process is gone,
/// after killing what still runs in them (daemons an earlier, crashed run of
/// this harness started). Answers the names removed.
///
/// # Errors
/// If the namespaces cannot be listed or one cannot be deleted.
pub fn remove_stale() -> anyhow::Result<Vec<String>> {
    let mut removed = Vec::new();
    for ns in list_namespaces()? {
        let Some(rest) = ns.strip_prefix(NS_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            // Its owner still runs (another test, or this process).
            continue;
        }
        if let Ok(out) = Command::new("ip").args(["netns", "pids", &ns]).output() {
            for p in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Some(pid) = p.parse().ok().and_then(rustix::process::Pid::from_raw) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
        if let Err(e) = ip(&["netns", "del", &ns]) {
            // Another run cleaning up at the same time removed it first.
            if list_namespaces()?.contains(&ns) {
                return Err(e);
            }
            continue;
        }
        removed.push(ns);
    }
    Ok(removed)
}

/// A UDP socket bound to `addr` inside namespace `ns` (it stays in that
/// namespace whichever thread uses it). For probing the network in tests.
///
/// # Errors
/// If the namespace cannot be entered or the socket cannot be bound.
pub fn udp_socket_in(ns: &str, addr: std::net::SocketAddr) -> anyhow::Result<std::net::UdpSocket> {
    run_in_namespace(ns, move || {
        std::net::UdpSocket::bind(addr).with_context(|| format!("cannot bind {addr}"))
    })?
}

/// Runs `f` on a thread of its own that entered namespace `ns` (setns
/// changes only the calling thread), and answers its result.
///
/// # Errors
/// If the namespace cannot be entered, or `f` panicked.
pub fn run_in_namespace<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<T> {
    let path = format!("/run/netns/{ns}");
    let file = std::fs::File::open(&path).with_context(|| format!("cannot open {path}"))?;
    std::thread::spawn(move || -> anyhow::Result<T> {
        use std::os::fd::AsFd as _;
        rustix::thread::move_into_link_name_space(
            file.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .context("setns failed")?;
        Ok(f())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the namespace thread panicked"))?
}

/// Runs `ip ARGS`; an error carries its stderr.
fn ip(args: &[&str]) -> anyhow::Result<()> {
    run("ip", args).map(drop)
}

/// [`ip`], under a name that does not shadow the `ip` address variables.
fn ip_cmd(args: &[&str]) -> anyhow::Result<()> {
    ip(args)
}

/// Runs `tc -n NS ARGS`; an error carries its stderr.
fn tc(ns: &str, args: &[&str]) -> anyhow::Result<()> {
    tc_output(ns, args).map(drop)
}

/// Runs `tc -n NS ARGS` and answers its stdout.
fn tc_output(ns: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    run("tc", &all)
}

fn run(tool: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(tool)
        .args(args)
        .output()
        .with_context(|| format!("cannot run `{tool}`"))?;
    if !out.status.success() {
        bail!(
            "`{tool} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loss_program_drops_the_asked_share() {
        assert_eq!(
            loss_bytecode(30),
            "4,32 0 0 4294963256,37 0 1 3006477107,6 0 0 4294967295,6 0 0 0"
        );
        // 100 % loss: every random value is above 0.
        assert!(loss_bytecode(100).contains("37 0 1 0,"));
    }

    #[test]
    fn node_addresses_are_inside_the_test_range() {
        let [a, b, c] = SUBNET_PREFIX;
        assert_eq!((a, b, c), (10, 213, 0));
        assert!(usize::from(NODE_HOST_BASE) + NODES_MAX < 255);
    }
}
