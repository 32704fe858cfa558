//! Checks of the generated workloads against an independent model: every block is executed
//! transaction by transaction with plain revm over the generated genesis, and the results are
//! compared with what ETH, ERC20 and constant-product semantics say they must be.

use crate::*;
use alloy_consensus::{Transaction, TxEnvelope, proofs::calculate_transaction_root};
use alloy_evm::FromRecoveredTx;
use alloy_primitives::{Address, B256, U256, map::HashMap};
use overdrive_primitives::{BlockWithSenders, MemState};
use revm::{
    Context, ExecuteCommitEvm, ExecuteEvm, MainBuilder, MainContext,
    context::{BlockEnv, TxEnv, result::ExecutionResult},
    context_interface::block::BlobExcessGasAndPrice,
    database::{State, states::bundle_state::BundleRetention},
    primitives::{eip4844::BLOB_BASE_FEE_UPDATE_FRACTION_PRAGUE, hardfork::SpecId},
};
use std::{collections::HashSet, path::Path};

fn config(kind: WorkloadKind) -> WorkloadConfig {
    WorkloadConfig {
        kind,
        accounts: 1_000,
        txs_per_block: 100,
        blocks: 2,
        seed: 7,
        hot_share: 0.3,
        sender_skew: 0.0,
        pairs: 300,
    }
}

fn gen_ok(cfg: &WorkloadConfig) -> Workload {
    match generate(cfg) {
        Ok(w) => w,
        Err(e) => panic!("generating {}: {e}", cfg.kind),
    }
}

fn block_env(block: &BlockWithSenders) -> BlockEnv {
    let h = &block.header;
    BlockEnv {
        number: U256::from(h.number),
        beneficiary: h.beneficiary,
        timestamp: U256::from(h.timestamp),
        gas_limit: h.gas_limit,
        basefee: h.base_fee_per_gas.unwrap_or_default(),
        difficulty: h.difficulty,
        prevrandao: Some(h.mix_hash),
        blob_excess_gas_and_price: Some(BlobExcessGasAndPrice::new(
            h.excess_blob_gas.unwrap_or_default(),
            BLOB_BASE_FEE_UPDATE_FRACTION_PRAGUE,
        )),
        ..Default::default()
    }
}

/// Executes every block transaction by transaction (no system calls: none of the generated
/// transactions depends on them) and returns the final state and each transaction's result.
fn execute(w: &Workload) -> (MemState, Vec<ExecutionResult>) {
    let mut state = w.genesis.clone();
    let mut results = Vec::new();
    for block in &w.blocks {
        let bundle = {
            let db = State::builder()
                .with_database_ref(&state)
                .with_bundle_update()
                .build();
            let mut evm = Context::mainnet()
                .with_db(db)
                .modify_block_chained(|b: &mut BlockEnv| *b = block_env(block))
                .modify_cfg_chained(|c| {
                    c.set_spec_and_mainnet_gas_params(SpecId::PRAGUE);
                    c.chain_id = w.chain_spec.chain_id;
                })
                .build_mainnet();
            for tx in &block.transactions {
                let env = TxEnv::from_recovered_tx(tx.inner(), tx.signer());
                match evm.transact_commit(env) {
                    Ok(result) => results.push(result),
                    Err(e) => panic!("block {} tx {}: invalid: {e}", block.number(), tx.tx_hash()),
                }
            }
            let mut db = evm.ctx.journaled_state.database;
            db.merge_transitions(BundleRetention::PlainState);
            db.take_bundle()
        };
        state.apply_bundle(&bundle);
    }
    (state, results)
}

fn storage(state: &MemState, account: Address, slot: U256) -> U256 {
    state
        .accounts
        .get(&account)
        .and_then(|a| a.storage.get(&slot))
        .copied()
        .unwrap_or_default()
}

fn eth(state: &MemState, account: Address) -> U256 {
    state
        .accounts
        .get(&account)
        .map(|a| a.info.balance)
        .unwrap_or_default()
}

fn total_eth(state: &MemState) -> U256 {
    state.accounts.values().map(|a| a.info.balance).sum()
}

/// What the blocks must do, computed without an EVM: ETH moves and fees, ERC20 transfers and
/// allowances, and Uniswap V2 swaps by the constant-product formula with the 0.3% fee.
#[derive(Default)]
struct Model {
    eth: HashMap<Address, U256>,
    tokens: HashMap<(Address, Address), U256>,
    /// (token, owner, spender) -> allowance, for the allowances the blocks set or spent.
    allowances: HashMap<(Address, Address, Address), U256>,
    /// `transferFrom` calls, and those that spent an approval of the same block.
    spends: usize,
    spends_in_block: usize,
    /// Timestamp of the block that set each allowance.
    approved_at: HashMap<(Address, Address, Address), u64>,
    reserves: HashMap<Address, (U256, U256)>,
    burnt: U256,
    swaps_per_pair: HashMap<Address, usize>,
    last_swap_time: HashMap<Address, u64>,
    /// The compute contract's result slot of each caller.
    computed: HashMap<Address, U256>,
}

impl Model {
    fn eth_mut<'a>(&'a mut self, genesis: &MemState, a: Address) -> &'a mut U256 {
        self.eth.entry(a).or_insert_with(|| eth(genesis, a))
    }

    fn token_mut<'a>(
        &'a mut self,
        genesis: &MemState,
        token: Address,
        holder: Address,
    ) -> &'a mut U256 {
        self.tokens
            .entry((token, holder))
            .or_insert_with(|| storage(genesis, token, erc20::balance_slot(holder)))
    }

    fn move_tokens(
        &mut self,
        genesis: &MemState,
        token: Address,
        from: Address,
        to: Address,
        amount: U256,
    ) {
        let from_balance = self.token_mut(genesis, token, from);
        assert!(
            *from_balance >= amount,
            "model: {from} cannot pay {amount} of {token}"
        );
        *from_balance -= amount;
        *self.token_mut(genesis, token, to) += amount;
    }

    /// `transfer`, `approve` or `transferFrom` (which must stay within the allowance; the
    /// generator never approves `U256::MAX`, which OpenZeppelin would not decrement).
    fn token_call(
        &mut self,
        genesis: &MemState,
        timestamp: u64,
        token: Address,
        sender: Address,
        input: &[u8],
    ) {
        if let Some((recipient, amount)) = erc20::decode_transfer(input) {
            self.move_tokens(genesis, token, sender, recipient, amount);
        } else if let Some((spender, amount)) = erc20::decode_approve(input) {
            self.allowances.insert((token, sender, spender), amount);
            self.approved_at.insert((token, sender, spender), timestamp);
        } else if let Some((from, recipient, amount)) = erc20::decode_transfer_from(input) {
            let key = (token, from, sender);
            let allowance = self
                .allowances
                .entry(key)
                .or_insert_with(|| storage(genesis, token, erc20::allowance_slot(from, sender)));
            assert!(
                *allowance >= amount,
                "model: {sender} spends {amount} of {from}'s {token} above its allowance"
            );
            *allowance -= amount;
            self.spends += 1;
            self.spends_in_block += usize::from(self.approved_at.get(&key) == Some(&timestamp));
            self.move_tokens(genesis, token, from, recipient, amount);
        } else {
            panic!("unexpected call of token {token}: {input:?}");
        }
    }

    fn apply(
        &mut self,
        w: &Workload,
        timestamp: u64,
        tx: &TxEnvelope,
        sender: Address,
        gas_used: u64,
    ) {
        let g = &w.genesis;
        let base_fee = U256::from(BASE_FEE);
        let price = U256::from(tx.effective_gas_price(Some(BASE_FEE)));
        let gas = U256::from(gas_used);
        let to = tx.to().expect("generated transactions are calls");
        *self.eth_mut(g, sender) -= gas * price + tx.value();
        *self.eth_mut(g, to) += tx.value();
        *self.eth_mut(g, COINBASE) += gas * (price - base_fee);
        self.burnt += gas * base_fee;

        if Some(to) == w.contracts.token {
            self.token_call(g, timestamp, to, sender, tx.input());
        } else if let Some(uni) = w.contracts.uniswap.as_ref().filter(|u| u.router == to) {
            let swap = uniswap::decode_swap(tx.input()).expect("router call is a swap");
            let pair = uniswap::pair_address(uni.factory, swap.token_in, swap.token_out);
            let (r0, r1) = *self.reserves.entry(pair).or_insert_with(|| {
                let (r0, r1, _) =
                    uniswap::decode_reserves(storage(g, pair, uniswap::RESERVES_SLOT));
                (r0, r1)
            });
            let token0_in = swap.token_in < swap.token_out;
            let (r_in, r_out) = if token0_in { (r0, r1) } else { (r1, r0) };
            let out = uniswap::amount_out(swap.amount_in, r_in, r_out);
            assert!(out >= swap.amount_out_min && !out.is_zero());
            self.move_tokens(g, swap.token_in, sender, pair, swap.amount_in);
            self.move_tokens(g, swap.token_out, pair, swap.to, out);
            let (n_in, n_out) = (r_in + swap.amount_in, r_out - out);
            self.reserves.insert(
                pair,
                if token0_in {
                    (n_in, n_out)
                } else {
                    (n_out, n_in)
                },
            );
            *self.swaps_per_pair.entry(pair).or_default() += 1;
            self.last_swap_time.insert(pair, timestamp);
        } else if Some(to) == w.contracts.compute {
            let rounds = U256::from_be_slice(tx.input());
            let slot = compute::result_slot(sender);
            let prev = *self
                .computed
                .entry(sender)
                .or_insert_with(|| storage(g, to, slot));
            let mut word = B256::from(prev ^ slot);
            for _ in 0..rounds.to::<u32>() {
                word = alloy_primitives::keccak256(word);
            }
            self.computed.insert(sender, word.into());
        } else {
            assert!(tx.input().is_empty(), "unexpected call to {to}");
        }
    }
}

/// Executes `w`, requires every transaction to succeed, and compares the final state with the
/// model. Returns the model for kind-specific checks.
fn execute_and_check(w: &Workload) -> (MemState, Model) {
    let (state, results) = execute(w);
    let txs: Vec<_> = w
        .blocks
        .iter()
        .flat_map(|b| b.transactions.iter().map(|tx| (b.header.timestamp, tx)))
        .collect();
    assert_eq!(results.len(), txs.len());
    let mut model = Model::default();
    for ((timestamp, tx), result) in txs.iter().zip(&results) {
        assert!(
            result.is_success(),
            "{} tx {} failed: {result:?}",
            w.config.kind,
            tx.tx_hash()
        );
        assert!(result.tx_gas_used() <= tx.gas_limit());
        model.apply(w, *timestamp, tx.inner(), tx.signer(), result.tx_gas_used());
    }

    // ETH: every modelled balance matches, and the total only shrank by the burnt base fee.
    for (account, expected) in &model.eth {
        assert_eq!(eth(&state, *account), *expected, "ETH balance of {account}");
    }
    assert_eq!(
        total_eth(&state) + model.burnt,
        total_eth(&w.genesis),
        "ETH is not conserved"
    );
    assert!(
        eth(&state, COINBASE) > U256::ZERO,
        "the coinbase earned no priority fees"
    );

    for ((token, holder), expected) in &model.tokens {
        assert_eq!(
            storage(&state, *token, erc20::balance_slot(*holder)),
            *expected,
            "{token} balance of {holder}"
        );
    }
    for ((token, owner, spender), expected) in &model.allowances {
        assert_eq!(
            storage(&state, *token, erc20::allowance_slot(*owner, *spender)),
            *expected,
            "{token} allowance of {spender} over {owner}'s balance"
        );
    }
    for (pair, (r0, r1)) in &model.reserves {
        let (s0, s1, timestamp) =
            uniswap::decode_reserves(storage(&state, *pair, uniswap::RESERVES_SLOT));
        assert_eq!((s0, s1), (*r0, *r1), "reserves of {pair}");
        assert_eq!(
            u64::from(timestamp),
            model.last_swap_time[pair],
            "blockTimestampLast of {pair}"
        );
    }
    for (caller, expected) in &model.computed {
        let compute = w
            .contracts
            .compute
            .expect("computed only with the contract");
        assert_eq!(
            storage(&state, compute, compute::result_slot(*caller)),
            *expected,
            "compute result of {caller}"
        );
    }
    let allowances = model
        .allowances
        .keys()
        .map(|(_, owner, spender)| erc20::allowance_slot(*owner, *spender));
    check_token_supplies(w, &state, allowances);
    (state, model)
}

/// For every ERC20: each non-zero storage slot is a known balance, allowance (the router's, or
/// one of `allowances` the blocks set) or metadata slot, and the balances sum to `totalSupply`.
fn check_token_supplies(w: &Workload, state: &MemState, allowances: impl Iterator<Item = U256>) {
    let mut holders: Vec<Address> = w.accounts.clone();
    holders.push(w.contracts.deployer);
    let mut tokens: Vec<Address> = w.contracts.token.into_iter().collect();
    let mut spenders = Vec::new();
    if let Some(uni) = &w.contracts.uniswap {
        holders.extend(uni.pairs.iter().map(|p| p.address));
        tokens.extend(uni.pairs.iter().flat_map(|p| [p.token0, p.token1]));
        spenders.push(uni.router);
    }
    let balance_slots: HashMap<U256, Address> = holders
        .iter()
        .map(|h| (erc20::balance_slot(*h), *h))
        .collect();
    let allowance_slots: HashSet<U256> = holders
        .iter()
        .flat_map(|h| spenders.iter().map(move |s| erc20::allowance_slot(*h, *s)))
        .chain(allowances)
        .collect();
    let metadata = [erc20::TOTAL_SUPPLY_SLOT, U256::from(3u8), U256::from(4u8)];
    for token in tokens {
        let account = &state.accounts[&token];
        let mut sum = U256::ZERO;
        for (slot, value) in &account.storage {
            if balance_slots.contains_key(slot) {
                sum += *value;
            } else {
                assert!(
                    allowance_slots.contains(slot) || metadata.contains(slot),
                    "token {token} has an unexplained slot {slot:#x}"
                );
            }
        }
        assert_eq!(
            sum,
            storage(state, token, erc20::TOTAL_SUPPLY_SLOT),
            "balances of {token} != totalSupply"
        );
    }
}

#[test]
fn kind_names_round_trip() {
    for kind in WorkloadKind::ALL {
        assert_eq!(kind.to_string().parse::<WorkloadKind>().unwrap(), kind);
    }
    assert_eq!(
        "ERC20".parse::<WorkloadKind>().unwrap(),
        WorkloadKind::Erc20
    );
    assert!(matches!(
        "swap".parse::<WorkloadKind>(),
        Err(WorkloadError::UnknownKind(_))
    ));
}

#[test]
fn bad_configs_are_errors() {
    let base = config(WorkloadKind::Uniswap);
    let cases = [
        WorkloadConfig {
            accounts: MIN_ACCOUNTS - 1,
            ..base.clone()
        },
        WorkloadConfig {
            hot_share: 1.5,
            ..base.clone()
        },
        WorkloadConfig {
            sender_skew: -0.1,
            ..base.clone()
        },
        WorkloadConfig {
            sender_skew: f64::NAN,
            ..base.clone()
        },
        WorkloadConfig {
            pairs: 0,
            ..base.clone()
        },
        WorkloadConfig {
            txs_per_block: usize::MAX,
            blocks: 2,
            ..base.clone()
        },
    ];
    for cfg in cases {
        assert!(
            matches!(generate(&cfg), Err(WorkloadError::InvalidConfig(_))),
            "{cfg:?}"
        );
    }
    // Pairs only matter where swaps are generated.
    assert!(
        WorkloadConfig {
            pairs: 0,
            ..config(WorkloadKind::Erc20)
        }
        .validate()
        .is_ok()
    );
}

#[test]
fn missing_artifacts_name_the_setup_script() {
    let dir = Path::new("/nonexistent/overdrive-artifacts");
    for kind in [
        WorkloadKind::Erc20,
        WorkloadKind::Uniswap,
        WorkloadKind::Hybrid,
        WorkloadKind::Chained,
    ] {
        let err = generate_with_artifacts(&config(kind), dir).expect_err("no artifacts there");
        assert!(
            matches!(err, WorkloadError::MissingArtifacts { .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("scripts/setup-contracts.sh"),
            "{err}"
        );
    }
    // ETH transfers need no contracts.
    let w = generate_with_artifacts(&config(WorkloadKind::Transfer), dir)
        .expect("transfer needs no artifacts");
    assert_eq!(w.blocks.len(), 2);
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let encode = |w: &Workload| -> Vec<Vec<u8>> {
        w.blocks
            .iter()
            .map(|b| alloy_rlp::encode(b.to_block()))
            .collect()
    };
    let cfg = WorkloadConfig {
        sender_skew: 0.2,
        pairs: 20,
        ..config(WorkloadKind::Hybrid)
    };
    let a = gen_ok(&cfg);
    let b = gen_ok(&cfg);
    assert_eq!(encode(&a), encode(&b));
    assert_eq!(a.genesis, b.genesis);
    assert_eq!(a.genesis_header, b.genesis_header);

    let c = gen_ok(&WorkloadConfig {
        seed: cfg.seed + 1,
        ..cfg.clone()
    });
    for (x, y) in a.blocks.iter().zip(&c.blocks) {
        assert_ne!(x.hash, y.hash);
        let hashes = |b: &BlockWithSenders| {
            b.transactions
                .iter()
                .map(|t| *t.tx_hash())
                .collect::<HashSet<B256>>()
        };
        assert!(
            hashes(x).is_disjoint(&hashes(y)),
            "two seeds produced a common transaction"
        );
    }
    assert_ne!(a.accounts, c.accounts);
    // Contract addresses do not depend on the seed.
    assert_eq!(a.contracts, c.contracts);
}

#[test]
fn blocks_are_well_formed_and_linked() {
    let w = gen_ok(&WorkloadConfig {
        pairs: 10,
        sender_skew: 0.3,
        ..config(WorkloadKind::Hybrid)
    });
    // The parallel root equals alloy-trie's reference root over the chain spec's allocation.
    let reference_root = alloy_trie::root::state_root_ref_unhashed(&w.chain_spec.genesis.alloc);
    assert_eq!(w.genesis_header.state_root, reference_root);
    assert_eq!(w.genesis.block_hashes.get(&0), Some(&w.genesis_hash()));
    // The chain spec's allocation is the genesis state.
    let from_alloc = MemState::from_alloc(&w.chain_spec.genesis.alloc);
    assert_eq!(from_alloc.accounts, w.genesis.accounts);
    assert_eq!(from_alloc.contracts, w.genesis.contracts);
    assert_eq!(
        w.chain_spec.genesis_header(w.genesis_header.state_root),
        w.genesis_header
    );

    let mut parent = w.genesis_header.clone();
    for block in &w.blocks {
        let h = &block.header;
        assert_eq!(h.parent_hash, parent.hash_slow());
        assert_eq!(h.number, parent.number + 1);
        assert!(h.timestamp > parent.timestamp);
        assert_eq!(h.gas_limit, w.chain_spec.genesis.gas_limit);
        assert!(
            h.gas_limit
                >= block
                    .transactions
                    .iter()
                    .map(|t| t.gas_limit())
                    .sum::<u64>()
        );
        assert_eq!(h.beneficiary, COINBASE);
        assert_eq!(h.base_fee_per_gas, Some(BASE_FEE));
        assert!(h.parent_beacon_block_root.is_some() && h.requests_hash.is_some());
        assert_eq!(block.withdrawals.as_deref(), Some(&[][..]));
        let envelopes: Vec<TxEnvelope> = block
            .transactions
            .iter()
            .map(|t| t.inner().clone())
            .collect();
        assert_eq!(h.transactions_root, calculate_transaction_root(&envelopes));
        for tx in &block.transactions {
            assert!(tx.is_eip1559());
            assert_eq!(tx.chain_id(), Some(w.chain_spec.chain_id));
            assert!(tx.max_fee_per_gas() >= 2 * u128::from(BASE_FEE));
            assert!(tx.max_priority_fee_per_gas().unwrap_or_default() > 0);
        }
        // Through RLP and back, recovering every signature, gives the same block and senders.
        let decoded =
            BlockWithSenders::decode(&alloy_rlp::encode(block.to_block())).expect("decodes");
        assert_eq!(&decoded, block);
        parent = h.clone();
    }
}

#[test]
fn transfers_execute_and_conserve_eth() {
    let w = gen_ok(&config(WorkloadKind::Transfer));
    assert_eq!(w.contracts.token, None);
    let (_, model) = execute_and_check(&w);
    assert!(model.tokens.is_empty());
    // Cold senders walk a permutation: with fewer transactions than accounts, none repeats.
    let senders: Vec<Address> = w.blocks.iter().flat_map(|b| b.senders()).collect();
    assert_eq!(senders.iter().collect::<HashSet<_>>().len(), senders.len());
}

#[test]
fn erc20_transfers_execute_and_balances_add_up() {
    let w = gen_ok(&config(WorkloadKind::Erc20));
    let token = w.contracts.token.expect("erc20 deploys a token");
    let (_, model) = execute_and_check(&w);
    let moved = model.tokens.keys().filter(|(t, _)| *t == token).count();
    assert!(moved >= 100, "only {moved} balances changed");
}

#[test]
fn allowances_are_approved_then_spent_exactly() {
    let w = gen_ok(&WorkloadConfig {
        txs_per_block: 300,
        ..config(WorkloadKind::Allowance)
    });
    let token = w.contracts.token.unwrap();
    let txs: Vec<_> = w.blocks.iter().flat_map(|b| &b.transactions).collect();
    assert!(txs.iter().all(|tx| tx.to() == Some(token)));
    let approvals = txs
        .iter()
        .filter(|tx| erc20::decode_approve(tx.input()).is_some())
        .count();
    let (_, model) = execute_and_check(&w);
    // The model checked each spend against its allowance; here, the mix is what the kind
    // promises: half approvals, spends both inside the approving block and in later ones,
    // and every spent allowance back at zero.
    assert_eq!(approvals + model.spends, txs.len());
    assert!(
        (250..=350).contains(&approvals),
        "{approvals} approvals of 600"
    );
    assert!(
        model.spends_in_block >= 50,
        "{} spends in the approving block",
        model.spends_in_block
    );
    assert!(
        model.spends - model.spends_in_block >= 5,
        "no spend of an earlier block's approval"
    );
    let open = model.allowances.values().filter(|a| !a.is_zero()).count();
    assert_eq!(open, approvals - model.spends);
}

#[test]
fn chained_transfers_form_one_chain() {
    let w = gen_ok(&config(WorkloadKind::Chained));
    let token = w.contracts.token.unwrap();
    let mut previous_recipient = None;
    for tx in w.blocks.iter().flat_map(|b| &b.transactions) {
        assert_eq!(tx.to(), Some(token));
        let (recipient, _) = erc20::decode_transfer(tx.input()).unwrap();
        if let Some(prev) = previous_recipient {
            assert_eq!(
                tx.signer(),
                prev,
                "tx {} does not spend what the previous one sent",
                tx.tx_hash()
            );
        }
        assert_ne!(recipient, tx.signer());
        previous_recipient = Some(recipient);
    }
    execute_and_check(&w);
}

#[test]
fn uniswap_swaps_move_reserves_on_many_pairs() {
    let w = gen_ok(&config(WorkloadKind::Uniswap));
    let uni = w.contracts.uniswap.clone().unwrap();
    assert_eq!(uni.pairs.len(), 300);
    let distinct: HashSet<Address> = uni
        .pairs
        .iter()
        .flat_map(|p| [p.token0, p.token1])
        .collect();
    assert_eq!(distinct.len(), 600, "pairs must not share tokens");
    for p in &uni.pairs {
        assert_eq!(
            p.address,
            uniswap::pair_address(uni.factory, p.token0, p.token1)
        );
        assert!(p.token0 < p.token1);
    }
    let (state, model) = execute_and_check(&w);
    assert!(
        model.swaps_per_pair.len() > 100,
        "swaps hit only {} pairs",
        model.swaps_per_pair.len()
    );
    for (pair, swaps) in &model.swaps_per_pair {
        let before = storage(&w.genesis, *pair, uniswap::RESERVES_SLOT);
        let after = storage(&state, *pair, uniswap::RESERVES_SLOT);
        assert_ne!(
            before, after,
            "{swaps} swaps left {pair}'s reserves unchanged"
        );
        let (r0, r1, _) = uniswap::decode_reserves(after);
        let info = uni.pairs.iter().find(|p| p.address == *pair).unwrap();
        // The pair's token balances are its reserves (every swap ends with `_update`).
        assert_eq!(storage(&state, info.token0, erc20::balance_slot(*pair)), r0);
        assert_eq!(storage(&state, info.token1, erc20::balance_slot(*pair)), r1);
        // The 0.3% fee stays in the pool: k grows.
        let (b0, b1, _) = uniswap::decode_reserves(before);
        assert!(r0 * r1 > b0 * b1);
    }
}

/// The router kind: the uniswap blocks' swaps, through the fee-on-transfer variant, with the
/// same effect (the model computes each swap's output and the pair's reserves).
#[test]
fn router_swaps_are_the_uniswap_swaps_under_another_selector() {
    let router = gen_ok(&config(WorkloadKind::Router));
    let plain = gen_ok(&config(WorkloadKind::Uniswap));
    let txs = |w: &Workload| -> Vec<TxEnvelope> {
        w.blocks
            .iter()
            .flat_map(|b| b.transactions.iter().map(|tx| tx.inner().clone()))
            .collect()
    };
    let (router_txs, plain_txs) = (txs(&router), txs(&plain));
    assert_eq!(router_txs.len(), plain_txs.len());
    for (r, p) in router_txs.iter().zip(&plain_txs) {
        assert_eq!(
            uniswap::decode_swap(r.input()),
            uniswap::decode_swap(p.input())
        );
        assert_eq!(r.input()[..4], [0x5c, 0x11, 0xd7, 0x95]);
        assert_eq!(
            p.input()[..4],
            uniswap::SWAP_EXACT_TOKENS_FOR_TOKENS_SELECTOR
        );
    }
    let (state, model) = execute_and_check(&router);
    let (plain_state, plain_model) = execute_and_check(&plain);
    assert!(model.swaps_per_pair.len() > 100);
    assert_eq!(model.reserves, plain_model.reserves);
    let uni = router.contracts.uniswap.as_ref().unwrap();
    for pair in &uni.pairs {
        assert_eq!(
            storage(&state, pair.address, uniswap::RESERVES_SLOT),
            storage(&plain_state, pair.address, uniswap::RESERVES_SLOT)
        );
    }
}

#[test]
fn hybrid_mixes_kinds_and_hot_share_sets_contention() {
    for hot_share in [0.0, 0.5] {
        let w = gen_ok(&WorkloadConfig {
            hot_share,
            pairs: 30,
            txs_per_block: 300,
            ..config(WorkloadKind::Hybrid)
        });
        let uni = w.contracts.uniswap.clone().unwrap();
        let (token, hot, hot_pair) = (w.contracts.token.unwrap(), w.hot_account(), uni.pairs[0]);
        let (mut kinds, mut hot_txs, mut total) = ([0usize; 3], 0usize, 0usize);
        for tx in w.blocks.iter().flat_map(|b| &b.transactions) {
            total += 1;
            let to = tx.to().unwrap();
            let touches_hot = if to == token {
                kinds[1] += 1;
                erc20::decode_transfer(tx.input()).unwrap().0 == hot
            } else if to == uni.router {
                kinds[2] += 1;
                let s = uniswap::decode_swap(tx.input()).unwrap();
                uniswap::sort_tokens(s.token_in, s.token_out) == (hot_pair.token0, hot_pair.token1)
            } else {
                kinds[0] += 1;
                to == hot
            };
            hot_txs += usize::from(touches_hot);
        }
        assert!(kinds.iter().all(|&k| k > total / 5), "mix {kinds:?}");
        let share = hot_txs as f64 / total as f64;
        assert!(
            (share - hot_share).abs() < 0.08,
            "hot share {share}, asked {hot_share}"
        );
        let (_, model) = execute_and_check(&w);
        assert!(!model.reserves.is_empty());
    }
}

#[test]
fn exchange_deposits_into_and_withdraws_from_the_hot_wallet() {
    let w = gen_ok(&WorkloadConfig {
        txs_per_block: 1_000,
        ..config(WorkloadKind::Exchange)
    });
    let hot = w.hot_account();
    let txs: Vec<_> = w.blocks.iter().flat_map(|b| &b.transactions).collect();
    let withdrawals = txs.iter().filter(|tx| tx.signer() == hot).count();
    let deposits = txs.iter().filter(|tx| tx.to() == Some(hot)).count();
    // One and ten in a hundred, of 2,000.
    assert!((8..=40).contains(&withdrawals), "{withdrawals} withdrawals");
    assert!((140..=260).contains(&deposits), "{deposits} deposits");
    execute_and_check(&w);
}

#[test]
fn compute_calls_hash_as_the_model_says() {
    // Hot senders call several times, so later calls start from an earlier call's result.
    let w = gen_ok(&WorkloadConfig {
        txs_per_block: 40,
        sender_skew: 0.5,
        ..config(WorkloadKind::Compute)
    });
    assert_eq!(w.contracts.compute, Some(compute::ADDRESS));
    let (_, model) = execute_and_check(&w);
    let callers = w.blocks.iter().flat_map(|b| &b.transactions).count();
    assert!(model.computed.len() < callers, "no sender called twice");
    let (_, results) = execute(&w);
    for result in &results {
        let gas = result.tx_gas_used();
        assert!((200_000..1_000_000).contains(&gas), "{gas} gas");
    }
}

#[test]
fn sender_skew_sends_from_hot_senders_with_consecutive_nonces() {
    let w = gen_ok(&WorkloadConfig {
        sender_skew: 0.5,
        ..config(WorkloadKind::Erc20)
    });
    let hot: HashSet<Address> = w.hot_senders().iter().copied().collect();
    let mut next_nonce: HashMap<Address, u64> = HashMap::default();
    let mut from_hot = 0;
    let txs: Vec<_> = w.blocks.iter().flat_map(|b| &b.transactions).collect();
    for tx in &txs {
        let expected = next_nonce.entry(tx.signer()).or_default();
        assert_eq!(tx.nonce(), *expected);
        *expected += 1;
        from_hot += usize::from(hot.contains(&tx.signer()));
    }
    let share = from_hot as f64 / txs.len() as f64;
    assert!((share - 0.5).abs() < 0.1, "hot sender share {share}");
    execute_and_check(&w);

    // Without skew the hot senders stay silent.
    let unskewed = gen_ok(&config(WorkloadKind::Erc20));
    assert!(
        unskewed
            .blocks
            .iter()
            .flat_map(|b| b.senders())
            .all(|s| !hot.contains(&s))
    );
}

/// The slot helpers agree with the contracts' own getters, executed by revm.
#[test]
fn slot_helpers_match_the_contract_getters() {
    let w = gen_ok(&WorkloadConfig {
        pairs: 3,
        ..config(WorkloadKind::Hybrid)
    });
    let uni = w.contracts.uniswap.clone().unwrap();
    let db = State::builder().with_database_ref(&w.genesis).build();
    let mut evm = Context::mainnet()
        .with_db(db)
        .modify_block_chained(|b: &mut BlockEnv| *b = block_env(&w.blocks[0]))
        .modify_cfg_chained(|c| {
            c.set_spec_and_mainnet_gas_params(SpecId::PRAGUE);
            c.chain_id = w.chain_spec.chain_id;
            c.disable_nonce_check = true;
        })
        .build_mainnet();
    let mut view = |to: Address, data: alloy_primitives::Bytes| -> U256 {
        let tx = TxEnv::builder()
            .caller(w.accounts[0])
            .call(to)
            .data(data)
            .gas_limit(1_000_000)
            .gas_price(MAX_FEE_PER_GAS)
            .chain_id(Some(w.chain_spec.chain_id))
            .build()
            .unwrap();
        let out = evm.transact(tx).unwrap().result.into_output().unwrap();
        U256::from_be_slice(&out[..32])
    };
    let swap_sender = w
        .blocks
        .iter()
        .flat_map(|b| &b.transactions)
        .find(|t| t.to() == Some(uni.router))
        .map(|t| {
            (
                t.signer(),
                uniswap::decode_swap(t.input()).unwrap().token_in,
            )
        })
        .unwrap();
    let mut checked = 0;
    for (token, owner) in [
        (w.contracts.token.unwrap(), w.accounts[9]),
        (swap_sender.1, swap_sender.0),
    ] {
        let balance = view(token, erc20::encode_balance_of(owner));
        assert!(!balance.is_zero());
        assert_eq!(
            balance,
            storage(&w.genesis, token, erc20::balance_slot(owner))
        );
        let allowance = view(token, erc20::encode_allowance(owner, uni.router));
        assert_eq!(
            allowance,
            storage(&w.genesis, token, erc20::allowance_slot(owner, uni.router))
        );
        let supply = view(
            token,
            alloy_primitives::Bytes::from(erc20::TOTAL_SUPPLY_SELECTOR.to_vec()),
        );
        assert_eq!(supply, storage(&w.genesis, token, erc20::TOTAL_SUPPLY_SLOT));
        checked += usize::from(allowance == U256::MAX);
    }
    assert_eq!(
        checked, 1,
        "the swap sender approves the router, the plain holder does not"
    );
}
