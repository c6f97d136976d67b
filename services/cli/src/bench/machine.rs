//! Which machine a benchmark ran on, said in every report: cores, memory,
//! kernel, the PostgreSQL on PATH (the one the benches start), and how this
//! `soldonce` was built.

use serde::Serialize;

/// The machine and the measuring binary.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub postgres: String,
    /// `debug` or `release`: how this `soldonce` (the load generator) was built.
    pub soldonce_build: &'static str,
    pub date: String,
}

impl Machine {
    /// This machine, now.
    pub fn describe() -> Machine {
        let postgres = std::process::Command::new("postgres")
            .arg("--version")
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "unknown".to_owned());
        Machine {
            cores: platform::runtime::cores(),
            memory_gib: memory_gib(),
            kernel: kernel(),
            postgres: postgres.replace("postgres (PostgreSQL) ", "PostgreSQL "),
            soldonce_build: build(),
            date: now(),
        }
    }

    /// One line for a report.
    pub fn line(&self) -> String {
        format!(
            "{} cores, {:.1} GiB, {}, {}; soldonce ({} build) measuring; {}",
            self.cores, self.memory_gib, self.kernel, self.postgres, self.soldonce_build, self.date
        )
    }
}

/// The machine's memory, from `/proc/meminfo` (0 where there is none).
pub fn memory_gib() -> f64 {
    let kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    kib / (1024.0 * 1024.0)
}

/// The kernel, as `/proc/sys/kernel` names it (`Linux 6.1.0-…`).
pub fn kernel() -> String {
    ["ostype", "osrelease"]
        .map(|f| std::fs::read_to_string(format!("/proc/sys/kernel/{f}")).unwrap_or_default())
        .map(|s| s.trim().to_owned())
        .join(" ")
        .trim()
        .to_owned()
}

/// How this `soldonce` was built: a debug build's figures say little.
pub fn build() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// Now, to the minute, for a report's stamp.
pub fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string()
}
