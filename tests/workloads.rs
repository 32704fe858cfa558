//! Every workload executes on the sequential reference as intended: all transactions succeed,
//! ETH is conserved up to exactly the burnt base fee, and every token's balances sum to its
//! total supply.

use alloy_primitives::{Address, U256};
use overdrive_executor::{ExecuteBlock, SequentialExecutor};
use overdrive_primitives::MemState;
use overdrive_workload::{BASE_FEE, Workload, WorkloadConfig, WorkloadKind, erc20, generate};

fn small(kind: WorkloadKind, seed: u64) -> Workload {
    let cfg = WorkloadConfig {
        accounts: 400,
        txs_per_block: 120,
        blocks: 3,
        seed,
        pairs: 12,
        sender_skew: if seed.is_multiple_of(2) { 0.0 } else { 0.3 },
        ..WorkloadConfig::new(kind)
    };
    generate(&cfg).expect("workload generates (run scripts/setup.sh for the artifacts)")
}

fn total_eth(state: &MemState) -> U256 {
    state.accounts.values().map(|a| a.info.balance).sum()
}

/// Every ERC20-layout token in the workload with the holders whose balances we can name.
fn tokens(w: &Workload) -> Vec<(Address, Vec<Address>)> {
    let mut holders: Vec<Address> = w.accounts.clone();
    holders.push(w.contracts.deployer);
    let mut tokens = Vec::new();
    if let Some(t) = w.contracts.token {
        tokens.push(t);
    }
    if let Some(u) = &w.contracts.uniswap {
        holders.extend(u.pairs.iter().map(|p| p.address));
        holders.push(u.router);
        tokens.extend(u.pairs.iter().flat_map(|p| [p.token0, p.token1]));
    }
    tokens.into_iter().map(|t| (t, holders.clone())).collect()
}

fn assert_supply_conserved(state: &MemState, token: Address, holders: &[Address]) {
    let account = &state.accounts[&token];
    let slot = |s: U256| account.storage.get(&s).copied().unwrap_or_default();
    let sum: U256 = holders.iter().map(|h| slot(erc20::balance_slot(*h))).sum();
    assert_eq!(
        sum,
        slot(erc20::TOTAL_SUPPLY_SLOT),
        "token {token}: balances do not sum to supply"
    );
}

fn check(kind: WorkloadKind, seed: u64) {
    let w = small(kind, seed);
    let mut state = w.genesis.clone();
    for block in &w.blocks {
        let before = total_eth(&state);
        let out = SequentialExecutor
            .execute(&w.chain_spec, block, &state)
            .unwrap();
        assert_eq!(out.receipts.len(), block.transactions.len());
        for (i, r) in out.receipts.iter().enumerate() {
            assert!(
                r.status(),
                "{kind} seed {seed}: tx {i} of block {} failed",
                block.number()
            );
        }
        state.apply_bundle(&out.bundle);
        let burnt = U256::from(out.gas_used) * U256::from(BASE_FEE);
        assert_eq!(
            total_eth(&state) + burnt,
            before,
            "{kind}: ETH not conserved"
        );
        for (token, holders) in tokens(&w) {
            assert_supply_conserved(&state, token, &holders);
        }
    }
    // The blocks changed what they should.
    assert_ne!(state, w.genesis);
}

#[test]
fn every_workload_executes_and_balances_add_up() {
    for kind in WorkloadKind::ALL {
        for seed in [1, 2] {
            check(kind, seed);
        }
    }
}

#[test]
fn uniswap_swaps_move_reserves() {
    let w = small(WorkloadKind::Uniswap, 3);
    let mut state = w.genesis.clone();
    for block in &w.blocks {
        let out = SequentialExecutor
            .execute(&w.chain_spec, block, &state)
            .unwrap();
        state.apply_bundle(&out.bundle);
    }
    let pairs = &w.contracts.uniswap.as_ref().unwrap().pairs;
    let reserves = |s: &MemState, p: Address| {
        s.accounts[&p]
            .storage
            .get(&overdrive_workload::uniswap::RESERVES_SLOT)
            .copied()
    };
    let moved = pairs
        .iter()
        .filter(|p| reserves(&state, p.address) != reserves(&w.genesis, p.address))
        .count();
    assert!(
        moved > pairs.len() / 2,
        "only {moved} of {} pairs traded",
        pairs.len()
    );
}
