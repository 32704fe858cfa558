//! Runs the trie benchmark: `cargo run --release -p overdrive-trie --example trie_bench --
//! --accounts 100000 --blocks 10 --threads 2 [--transfers 6000] [--seed 1] [--no-pin] [--prefault-heap MiB] [--json]`.

use overdrive_trie::bench::{TrieBenchConfig, run};

fn main() {
    let mut cfg = TrieBenchConfig::default();
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> u64 {
            let raw = args
                .next()
                .unwrap_or_else(|| fail(&format!("{name} needs a value")));
            raw.parse()
                .unwrap_or_else(|_| fail(&format!("{name}: not a number: {raw}")))
        };
        match arg.as_str() {
            "--accounts" => cfg.accounts = value("--accounts") as usize,
            "--blocks" => cfg.blocks = value("--blocks") as usize,
            "--threads" => cfg.threads = value("--threads") as usize,
            "--transfers" => cfg.transfers = value("--transfers") as usize,
            "--seed" => cfg.seed = value("--seed"),
            "--prefault-heap" => cfg.prefault_heap_mib = value("--prefault-heap") as usize,
            "--json" => json = true,
            "--no-pin" => cfg.pin_workers = false,
            other => fail(&format!("unknown argument {other}")),
        }
    }
    match run(&cfg) {
        Ok(report) if json => match serde_json::to_string(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => fail(&e.to_string()),
        },
        Ok(report) => println!("{report}"),
        Err(e) => fail(&e.to_string()),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("trie_bench: {message}");
    std::process::exit(2);
}

// reth runs on jemalloc; with glibc's malloc every allocation-heavy root (the baselines
// included) measures the allocator as much as the trie.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
