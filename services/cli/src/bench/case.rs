//! The saga bench's two cases, named alike in options and reports.

use clap::ValueEnum;
use serde::Serialize;

/// One case of the saga.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Case {
    /// Every order buys the same SKU.
    Hot,
    /// Orders spread over 10,000 SKUs.
    #[value(name = "10k")]
    #[serde(rename = "10k")]
    TenK,
}

impl Case {
    /// Its name in options and reports.
    pub fn name(self) -> &'static str {
        match self {
            Case::Hot => "hot",
            Case::TenK => "10k",
        }
    }

    /// What the load generator buys: a SKU, or a prefix and a count.
    pub fn skus(self) -> (&'static str, u32) {
        match self {
            Case::Hot => ("BENCH-0", 1),
            Case::TenK => ("BENCH", super::system::BENCH_SKUS),
        }
    }
}
