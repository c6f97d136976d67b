//! CPU time by program, read from `/proc/*/stat` (Linux only): a snapshot
//! before a phase and one after give each program's CPU per order and how
//! busy the cores were. Programs are summed by name (every PostgreSQL
//! backend is `postgres`). The system's figures count only this process
//! and its descendants — the services, PostgreSQL and NATS the bench
//! started, and the load generator in this process — so another user's
//! build on a shared machine does not count as the saga's; the machine's
//! whole use (from `/proc/stat`) is reported beside it, since it competes
//! for the same cores.

use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// CPU seconds used so far, by program.
#[derive(Debug, Clone)]
pub struct Snapshot {
    at: Instant,
    system: BTreeMap<String, f64>,
    machine: f64,
}

/// One process as `/proc/<pid>/stat` has it.
struct Process {
    name: String,
    parent: u32,
    seconds: f64,
}

impl Snapshot {
    /// Reads every process now.
    pub fn take() -> Snapshot {
        let tick = clock_ticks();
        let mut processes: HashMap<u32, Process> = HashMap::new();
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) else {
                    continue;
                };
                if let Some(p) = read_stat(pid, tick) {
                    processes.insert(pid, p);
                }
            }
        }
        let ours = descendants_of(std::process::id(), &processes);
        let mut system = BTreeMap::new();
        for (pid, p) in &processes {
            if ours.contains(pid) {
                *system.entry(p.name.clone()).or_insert(0.0) += p.seconds;
            }
        }
        Snapshot {
            at: Instant::now(),
            system,
            machine: machine_busy(tick),
        }
    }

    /// What was used from `before` to this snapshot, per unit of work.
    pub fn since(&self, before: &Snapshot, orders: u64) -> CpuUse {
        let wall = self.at.duration_since(before.at).as_secs_f64().max(1e-9);
        let per = 1000.0 / (orders.max(1) as f64);
        let mut by_program: Vec<ProgramCpu> = self
            .system
            .iter()
            .map(|(name, s)| ProgramCpu {
                program: name.clone(),
                ms_per_order: (s - before.system.get(name).copied().unwrap_or(0.0)) * per,
            })
            .filter(|p| p.ms_per_order > 0.0)
            .collect();
        by_program.sort_by(|a, b| b.ms_per_order.total_cmp(&a.ms_per_order));
        let system: f64 = by_program.iter().map(|p| p.ms_per_order).sum();
        let machine = (self.machine - before.machine).max(0.0);
        let cores = platform::runtime::cores() as f64;
        CpuUse {
            orders,
            wall_seconds: wall,
            ms_per_order: system,
            machine_ms_per_order: machine * per,
            cores_busy: machine / (wall * cores),
            system_cores_busy: system / per / (wall * cores),
            by_program,
        }
    }
}

/// CPU used during a phase.
#[derive(Debug, Clone, Serialize)]
pub struct CpuUse {
    /// What the figures are divided by.
    pub orders: u64,
    pub wall_seconds: f64,
    /// Every program of the system (the services, PostgreSQL, NATS, the load generator).
    pub ms_per_order: f64,
    /// Every process on the machine.
    pub machine_ms_per_order: f64,
    /// How busy the cores were, every process counted (0 to 1).
    pub cores_busy: f64,
    /// The share of the cores the system's programs used (0 to 1).
    pub system_cores_busy: f64,
    /// The system's programs, the most costly first.
    pub by_program: Vec<ProgramCpu>,
}

/// One program's CPU per order.
#[derive(Debug, Clone, Serialize)]
pub struct ProgramCpu {
    pub program: String,
    pub ms_per_order: f64,
}

impl CpuUse {
    /// A program's milliseconds per order (0 when it used none).
    pub fn program(&self, name: &str) -> f64 {
        self.by_program
            .iter()
            .find(|p| p.program == name)
            .map_or(0.0, |p| p.ms_per_order)
    }

    /// One line for people: the total, the top programs and the cores.
    pub fn line(&self) -> String {
        let top: Vec<String> = self
            .by_program
            .iter()
            .take(8)
            .map(|p| format!("{} {:.2}", p.program, p.ms_per_order))
            .collect();
        format!(
            "{:.2} ms per order, every program of the system ({}); the machine {:.2} ms; the {} cores {:.0}% busy over {:.1} s",
            self.ms_per_order,
            top.join(", "),
            self.machine_ms_per_order,
            platform::runtime::cores(),
            100.0 * self.cores_busy,
            self.wall_seconds
        )
    }
}

/// The CPU seconds every core has been busy since boot (`/proc/stat`'s
/// first line: user, nice, system, irq, softirq and steal; not idle or
/// waiting for I/O). A sum over `/proc/*/stat` instead loses what the
/// processes that exited meanwhile used (every short-lived `psql`, a
/// parallel test's process), and read below what this process alone used.
fn machine_busy(tick: f64) -> f64 {
    let Some(line) = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| s.lines().next().map(str::to_owned))
    else {
        return 0.0;
    };
    let jiffies: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| jiffies.get(i))
        .sum::<f64>()
        / tick
}

fn read_stat(pid: u32, tick: f64) -> Option<Process> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    // The kernel's workers (kworker/u8:1-…) count as one program.
    let name = stat[open + 1..close].split('/').next()?.to_owned();
    let rest: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    let parent = rest.get(1)?.parse().ok()?;
    let user: f64 = rest.get(11)?.parse().ok()?;
    let kernel: f64 = rest.get(12)?.parse().ok()?;
    Some(Process {
        name,
        parent,
        seconds: (user + kernel) / tick,
    })
}

/// `root` and every process below it.
fn descendants_of(root: u32, processes: &HashMap<u32, Process>) -> std::collections::HashSet<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (pid, p) in processes {
        children.entry(p.parent).or_default().push(*pid);
    }
    let mut found = std::collections::HashSet::from([root]);
    let mut stack = vec![root];
    while let Some(pid) = stack.pop() {
        for child in children.get(&pid).into_iter().flatten() {
            if found.insert(*child) {
                stack.push(*child);
            }
        }
    }
    found
}

/// Clock ticks per second of `/proc`'s CPU times (USER_HZ; 100 on Linux).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .filter(|t: &f64| *t > 0.0)
            .unwrap_or(100.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test process's own work counts as the system's, and the
    /// machine's busy time covers it, whatever other processes start and
    /// exit meanwhile (tests run in parallel): within two clock ticks, the
    /// two counters' granularity.
    #[test]
    fn this_process_is_part_of_the_system_it_measures() {
        let before = Snapshot::take();
        let started = Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(300) {
            for i in 0..100_000u64 {
                x = x.wrapping_add(i * i);
            }
        }
        assert!(x > 0);
        let used = Snapshot::take().since(&before, 1);
        assert!(used.ms_per_order > 0.0, "{used:?}");
        let two_ticks_ms = 2000.0 / clock_ticks();
        assert!(
            used.machine_ms_per_order >= used.ms_per_order - two_ticks_ms,
            "{used:?}"
        );
    }
}
