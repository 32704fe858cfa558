//! What a load run measured, from the chain: blocks as the poller saw them and, per
//! transaction, when it was sent and when its block was first seen.

use overdrive_bench::round;
use serde::Serialize;
use std::{collections::BTreeMap, fmt::Write as _};

/// A block the poller saw.
#[derive(Debug, Clone, Serialize)]
pub struct BlockSeen {
    /// Its number.
    pub number: u64,
    /// Seconds since the run started when the poller first saw it.
    pub seen_s: f64,
    /// Its transactions.
    pub txs: usize,
    /// Of them, the run's.
    pub ours: usize,
    /// Its gas used.
    pub gas_used: u64,
}

/// Raw observations of one run.
#[derive(Debug, Default)]
pub struct Observed {
    /// Per pre-signed transaction: seconds since the start when it was sent (`None`: never
    /// sent, or refused).
    pub sent: Vec<Option<f64>>,
    /// Per pre-signed transaction: seconds since the start when its block was first seen.
    pub included: Vec<Option<f64>>,
    /// The head when the run started, then every block after it, in order.
    pub blocks: Vec<BlockSeen>,
    /// Refused transactions by the node's error message.
    pub rejected: BTreeMap<String, usize>,
    /// Seconds since the start when the last transaction was sent.
    pub sending_s: f64,
}

/// One second of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Second {
    /// Seconds since the start.
    pub t: u64,
    /// Transactions whose block was first seen in this second.
    pub tps: usize,
    /// Their median inclusion latency, milliseconds.
    pub p50_ms: f64,
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub workload: String,
    pub accounts: usize,
    pub sent: usize,
    pub included: usize,
    pub rejected: usize,
    pub rejected_by_error: BTreeMap<String, usize>,
    /// Included transactions per second under load: over the blocks that carried the run's
    /// transactions while it was still sending (all of them if fewer than two were), so that a
    /// backlog drained after the sending stopped does not count.
    pub tps: f64,
    pub gas_per_s: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    /// Blocks that carried the run's transactions, and the seconds they span.
    pub blocks: usize,
    pub window_s: f64,
    /// CPU seconds the node used during the run (when the run started the node).
    pub node_cpu_s: Option<f64>,
    /// The same per included transaction, microseconds.
    pub node_cpu_us_per_tx: Option<f64>,
    /// Where the node spent its time, per block of the run (from its metrics), milliseconds.
    pub stage_ms_per_block: BTreeMap<String, f64>,
    pub series: Vec<Second>,
    pub block_log: Vec<BlockSeen>,
}

impl Report {
    /// Figures from `observed`.
    pub fn new(workload: &str, accounts: usize, observed: &Observed) -> Self {
        let blocks = &observed.blocks;
        let all_carrying: Vec<usize> = (0..blocks.len()).filter(|&i| blocks[i].ours > 0).collect();
        let while_sending: Vec<usize> = all_carrying
            .iter()
            .copied()
            .filter(|&i| blocks[i].seen_s <= observed.sending_s)
            .collect();
        let carrying = if while_sending.len() >= 2 {
            while_sending
        } else {
            all_carrying
        };
        let (mut tps, mut gas_per_s, mut window_s) = (0.0, 0.0, 0.0);
        if let (Some(&first), Some(&last)) = (carrying.first(), carrying.last()) {
            // From the block before the first that carried any (the run's start at worst) to
            // the last: every block in between counts, empty or not.
            let start = first.checked_sub(1).map_or(0.0, |i| blocks[i].seen_s);
            window_s = blocks[last].seen_s - start;
            let ours: usize = blocks[first..=last].iter().map(|b| b.ours).sum();
            let gas: u64 = blocks[first..=last].iter().map(|b| b.gas_used).sum();
            if window_s > 0.0 {
                tps = ours as f64 / window_s;
                gas_per_s = gas as f64 / window_s;
            }
        }
        let latencies_ms = |filter: &dyn Fn(f64) -> bool| {
            let mut v: Vec<f64> = observed
                .sent
                .iter()
                .zip(&observed.included)
                .filter_map(|(s, i)| Some((i.as_ref()? - s.as_ref()?, *i.as_ref()?)))
                .filter(|(_, at)| filter(*at))
                .map(|(latency, _)| latency * 1e3)
                .collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let all = latencies_ms(&|_| true);
        let seconds = observed
            .included
            .iter()
            .flatten()
            .map(|at| *at as u64)
            .max()
            .map_or(0, |s| s + 1);
        let series = (0..seconds)
            .map(|t| {
                let within = latencies_ms(&|at| at as u64 == t);
                Second {
                    t,
                    tps: within.len(),
                    p50_ms: round(percentile(&within, 0.50), 2),
                }
            })
            .collect();
        Self {
            workload: workload.to_string(),
            accounts,
            sent: observed.sent.iter().flatten().count(),
            included: observed.included.iter().flatten().count(),
            rejected: observed.rejected.values().sum(),
            rejected_by_error: observed.rejected.clone(),
            tps: round(tps, 2),
            gas_per_s: round(gas_per_s, 2),
            p50_ms: round(percentile(&all, 0.50), 2),
            p95_ms: round(percentile(&all, 0.95), 2),
            p99_ms: round(percentile(&all, 0.99), 2),
            blocks: carrying.len(),
            window_s: round(window_s, 2),
            node_cpu_s: None,
            node_cpu_us_per_tx: None,
            stage_ms_per_block: BTreeMap::new(),
            series,
            block_log: blocks.clone(),
        }
    }

    /// Records the seconds each stage took during the run, as milliseconds per block seen.
    pub fn set_stages(&mut self, seconds: impl IntoIterator<Item = (String, f64)>) {
        let blocks = self.block_log.len().saturating_sub(1).max(1) as f64;
        self.stage_ms_per_block = seconds
            .into_iter()
            .map(|(stage, s)| (stage, round(s * 1e3 / blocks, 2)))
            .collect();
    }

    /// Records the CPU seconds the node used during the run.
    pub fn set_node_cpu(&mut self, seconds: Option<f64>) {
        self.node_cpu_s = seconds.map(|s| round(s, 2));
        self.node_cpu_us_per_tx = seconds
            .filter(|_| self.included > 0)
            .map(|s| round(s * 1e6 / self.included as f64, 2));
    }

    /// TPS and median latency over time, as an SVG line chart.
    pub fn svg(&self, title: &str) -> String {
        let (w, h, pad) = (800.0, 320.0, 50.0);
        let n = self.series.len().max(2) as f64 - 1.0;
        let max_tps = self.series.iter().map(|s| s.tps).max().unwrap_or(0).max(1) as f64;
        let max_ms = self
            .series
            .iter()
            .map(|s| s.p50_ms)
            .fold(0.0, f64::max)
            .max(1.0);
        let line = |value: &dyn Fn(&Second) -> f64, max: f64| {
            let mut points = String::new();
            for (i, s) in self.series.iter().enumerate() {
                let x = pad + (w - 2.0 * pad) * i as f64 / n;
                let y = h - pad - (h - 2.0 * pad) * value(s) / max;
                let _ = write!(points, "{x:.1},{y:.1} ");
            }
            points
        };
        let mut svg = String::new();
        let _ = write!(
            svg,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{pad}" y="20" font-size="14">{title}</text>
<line x1="{pad}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="#888"/>
<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{y0}" stroke="#888"/>
<text x="{pad}" y="{yl}">0 s</text><text x="{x1}" y="{yl}" text-anchor="end">{secs} s</text>
<text x="5" y="{pad}" fill="#1f77b4">{max_tps:.0} tx/s</text>
<text x="{wr}" y="{pad}" fill="#d62728" text-anchor="end">{max_ms:.0} ms p50</text>
<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{tps}"/>
<polyline fill="none" stroke="#d62728" stroke-width="1.5" points="{lat}"/>
</svg>
"##,
            y0 = h - pad,
            x1 = w - pad,
            yl = h - pad + 16.0,
            wr = w - 5.0,
            secs = self.series.len(),
            tps = line(&|s| s.tps as f64, max_tps),
            lat = line(&|s| s.p50_ms, max_ms),
        );
        svg
    }
}

/// The `q` quantile of sorted `values` (nearest rank), 0 for none.
fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(number: u64, seen_s: f64, ours: usize) -> BlockSeen {
        BlockSeen {
            number,
            seen_s,
            txs: ours,
            ours,
            gas_used: ours as u64 * 21_000,
        }
    }

    #[test]
    fn figures_come_from_the_blocks_that_carried_the_run() {
        let observed = Observed {
            sent: vec![Some(0.1), Some(0.2), Some(1.5), None],
            included: vec![Some(1.0), Some(2.0), Some(2.0), None],
            blocks: vec![
                block(7, 0.0, 0),
                block(8, 1.0, 1),
                block(9, 2.0, 2),
                block(10, 3.0, 0),
            ],
            rejected: [("nonce too low".to_string(), 1)].into_iter().collect(),
            sending_s: 2.5,
        };
        let report = Report::new("transfer", 10, &observed);
        assert_eq!((report.sent, report.included, report.rejected), (3, 3, 1));
        // Three transactions over blocks 8 and 9, seen 2 s after block 7.
        assert_eq!((report.blocks, report.window_s, report.tps), (2, 2.0, 1.5));
        assert_eq!(report.gas_per_s, 31_500.0);
        // Latencies 900, 1800 and 500 ms.
        assert_eq!((report.p50_ms, report.p99_ms), (900.0, 1800.0));
        assert_eq!(report.series.len(), 3);
        assert_eq!((report.series[1].tps, report.series[2].tps), (1, 2));
        assert!(report.svg("t").starts_with("<svg"));
    }

    /// Blocks seen after the last send (a backlog draining) are left out of the rate.
    #[test]
    fn a_drained_backlog_does_not_count() {
        let observed = Observed {
            sent: vec![Some(0.0); 7],
            included: vec![
                Some(1.0),
                Some(2.0),
                Some(3.0),
                Some(3.0),
                Some(3.0),
                Some(3.0),
                Some(3.0),
            ],
            blocks: vec![
                block(0, 0.0, 0),
                block(1, 1.0, 1),
                block(2, 2.0, 1),
                block(3, 3.0, 5),
            ],
            rejected: BTreeMap::new(),
            sending_s: 2.5,
        };
        let report = Report::new("transfer", 10, &observed);
        assert_eq!((report.blocks, report.tps, report.included), (2, 1.0, 7));
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
    }
}
