use crate::{
    WorkloadConfig, WorkloadError, WorkloadKind,
    abi::{compute, erc20, uniswap},
    artifacts::{self, ContractCode},
    genesis::{self, DEPLOYER_TOKEN_SUPPLY, ETHER, Setup, UniswapDeployment},
    keys::{self, Signer},
    plan::{self, Action, PlannedTx},
};
use alloy_consensus::{
    EMPTY_OMMER_ROOT_HASH, Header, TxEip1559, TxEnvelope, constants::EMPTY_WITHDRAWALS,
    transaction::Recovered,
};
use alloy_eips::{eip2718::Encodable2718, eip7685::EMPTY_REQUESTS_HASH};
use alloy_primitives::{Address, B256, Bytes, TxKind, U256, address, keccak256, map::HashMap};
use overdrive_primitives::{BlockWithSenders, ChainParams, MemState};
use rayon::prelude::*;
use std::{collections::BTreeMap, path::Path};

/// Accounts `0..HOT_SENDERS` are the hot senders that `sender_skew` sends from.
pub const HOT_SENDERS: usize = 4;
/// Account index of the hot account: the recipient of the hybrid workload's hot transfers, and
/// the exchange workload's hot wallet.
pub const HOT_ACCOUNT: usize = HOT_SENDERS;
/// Beneficiary of every generated block. No genesis account lives here, so after execution
/// its balance is exactly the priority fees paid.
pub const COINBASE: Address = address!("0x00000000000000000000000000000000c014ba5e");
/// Base fee of every generated block. It is constant on purpose: the EIP-1559 update needs
/// the parent's gas used, which only execution knows, so the blocks do not follow it.
pub const BASE_FEE: u64 = 1_000_000_000;
/// `max_fee_per_gas` of every transaction: ten times the base fee.
pub const MAX_FEE_PER_GAS: u128 = 10 * BASE_FEE as u128;
/// `max_priority_fee_per_gas` of every transaction; the coinbase earns it on all gas used.
pub const MAX_PRIORITY_FEE_PER_GAS: u128 = BASE_FEE as u128;
/// Seconds between generated blocks.
pub const BLOCK_TIME: u64 = 12;
/// Gas limit of an ETH transfer (exactly what it uses).
pub const TRANSFER_GAS: u64 = 21_000;
/// Gas limit of an ERC20 `transfer` (it uses ~35k to ~52k, depending on whether the
/// recipient's balance slot was zero).
pub const ERC20_GAS: u64 = 80_000;
/// Gas limit of an ERC20 `approve` (≈ 46k setting a zero allowance) or `transferFrom` (≈ 40k
/// to ≈ 60k: the allowance is spent to zero, the recipient's balance may be new).
pub const ALLOWANCE_GAS: u64 = 100_000;
/// Gas limit of a router swap (they use ~105k to ~150k; the first swap on a pair pays for
/// the price accumulators' first writes, and a swapper's first receipt of a token for a new
/// balance slot).
pub const SWAP_GAS: u64 = 300_000;
/// Smallest block gas limit; larger blocks get the sum of their transactions' gas limits.
pub const MIN_BLOCK_GAS_LIMIT: u64 = 30_000_000;

/// Wei every account starts with: enough for [`crate::MAX_TOTAL_TXS`] transactions from one
/// account at the maximum fee.
const ACCOUNT_ETH: u128 = 1_000_000 * ETHER;
/// Main-token balance of every account (1e8 tokens): enough for `MAX_TOTAL_TXS` transfers.
const ACCOUNT_TOKENS: u128 = 100_000_000 * ETHER;
/// Pair-token balance a swapping account holds on top of what its swaps spend.
const SWAP_TOKEN_BASE: u128 = 1_000 * ETHER;

/// The contracts a workload deployed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contracts {
    /// The account that deployed everything (it also holds the main token's constructor mint
    /// and every pair's liquidity tokens).
    pub deployer: Address,
    /// The main ERC20 (erc20, hybrid and chained workloads).
    pub token: Option<Address>,
    /// Uniswap V2 (uniswap and hybrid workloads).
    pub uniswap: Option<UniswapDeployment>,
    /// The compute contract, at [`compute::ADDRESS`] (compute workload).
    pub compute: Option<Address>,
}

/// A generated workload: a genesis and the blocks to execute on it.
#[derive(Debug, Clone)]
pub struct Workload {
    /// What was generated.
    pub config: WorkloadConfig,
    /// `ChainParams::dev()`'s fork schedule (Prague at genesis, chain id 1337) whose genesis
    /// allocation is exactly [`Workload::genesis`] and whose gas limit is the blocks'.
    pub chain_spec: ChainParams,
    /// The genesis state: the dev chain's system contracts and dev accounts, the deployer,
    /// the contracts, and every funded account. `block_hashes[0]` is the genesis hash.
    pub genesis: MemState,
    /// The genesis header, with the state root of [`Workload::genesis`].
    pub genesis_header: Header,
    /// Blocks `1..=config.blocks`. Their post-execution fields (state root, receipts root,
    /// logs bloom, gas used) are zero: only execution can know them.
    pub blocks: Vec<BlockWithSenders>,
    /// Address of account `i` (its key is [`crate::private_key`]`(seed, i)`).
    pub accounts: Vec<Address>,
    /// Deployed contracts.
    pub contracts: Contracts,
}

impl Workload {
    /// The hybrid workload's hot account, the exchange workload's hot wallet.
    pub fn hot_account(&self) -> Address {
        self.accounts[HOT_ACCOUNT]
    }

    /// The accounts `sender_skew` sends from.
    pub fn hot_senders(&self) -> &[Address] {
        &self.accounts[..HOT_SENDERS]
    }

    /// Hash of the genesis header.
    pub fn genesis_hash(&self) -> B256 {
        self.genesis_header.hash_slow()
    }
}

/// Generates `cfg`'s workload, reading contract artifacts from [`artifacts::artifacts_dir`]
/// (the transfer workload needs none).
pub fn generate(cfg: &WorkloadConfig) -> Result<Workload, WorkloadError> {
    generate_with_artifacts(cfg, &artifacts::artifacts_dir())
}

/// [`generate`] with the artifacts read from `dir`.
pub fn generate_with_artifacts(
    cfg: &WorkloadConfig,
    dir: &Path,
) -> Result<Workload, WorkloadError> {
    cfg.validate()?;
    let needs_token = cfg.kind.needs_token() || cfg.kind.needs_uniswap();
    let token_code = needs_token
        .then(|| artifacts::load_token(dir))
        .transpose()?;
    let uniswap_code = cfg
        .kind
        .needs_uniswap()
        .then(|| artifacts::load_uniswap(dir))
        .transpose()?;

    let dev = ChainParams::dev();
    let deployer = Signer::new(keys::deployer_key()).address;
    let mut state = MemState::from_alloc(&dev.genesis.alloc);
    state.insert_account(
        deployer,
        U256::from(ACCOUNT_ETH),
        0,
        None,
        HashMap::default(),
    );

    // Key derivation (parallel, CPU-bound) overlaps the sequential contract setup.
    let (signers, deployed) = rayon::join(
        || keys::derive_signers(cfg.seed, cfg.accounts),
        || {
            deploy(
                cfg,
                &state,
                deployer,
                dev.chain_id,
                token_code.as_ref(),
                uniswap_code.as_ref(),
            )
        },
    );
    let (bundle, token, uniswap) = deployed?;
    state.apply_bundle(&bundle);
    // Hand-assembled code has no constructor: it is placed, as a genesis allocation would.
    let compute = (cfg.kind == WorkloadKind::Compute).then(|| {
        state.insert_account(
            compute::ADDRESS,
            U256::ZERO,
            1,
            Some(revm::bytecode::Bytecode::new_raw(Bytes::from_static(
                &compute::RUNTIME,
            ))),
            HashMap::default(),
        );
        compute::ADDRESS
    });
    genesis::normalize_code(&mut state);
    if let (Some(token), Some(code)) = (token, &token_code) {
        check_token(&state, token, deployer, code)?;
    }

    let plan = plan::plan(cfg);
    fund_accounts(&mut state, &signers, token, uniswap.as_ref(), &plan);

    let block_gas_limit = plan
        .iter()
        .map(|txs| txs.iter().map(|tx| gas_limit(&tx.action)).sum::<u64>())
        .max()
        .unwrap_or_default()
        .max(MIN_BLOCK_GAS_LIMIT);
    let mut genesis = dev.genesis.clone();
    genesis.gas_limit = block_gas_limit;
    genesis.alloc = genesis::to_alloc(&state);
    let chain_spec = ChainParams::from_genesis(genesis);
    let genesis_header = chain_spec.genesis_header(genesis::state_root(&state));
    let genesis_hash = genesis_header.hash_slow();
    state
        .block_hashes
        .insert(genesis_header.number, genesis_hash);

    let targets = Targets {
        token,
        uniswap: uniswap.as_ref(),
        chain_id: chain_spec.chain_id,
        fee_on_transfer_swaps: cfg.kind == WorkloadKind::Router,
    };
    let blocks = build_blocks(
        cfg,
        &plan,
        &signers,
        &targets,
        &genesis_header,
        block_gas_limit,
    );
    Ok(Workload {
        config: cfg.clone(),
        chain_spec,
        genesis: state,
        genesis_header,
        blocks,
        accounts: signers.iter().map(|s| s.address).collect(),
        contracts: Contracts {
            deployer,
            token,
            uniswap,
            compute,
        },
    })
}

type Deployed = (
    revm::database::BundleState,
    Option<Address>,
    Option<UniswapDeployment>,
);

fn deploy(
    cfg: &WorkloadConfig,
    state: &MemState,
    deployer: Address,
    chain_id: u64,
    token_code: Option<&ContractCode>,
    uniswap_code: Option<&artifacts::UniswapCode>,
) -> Result<Deployed, WorkloadError> {
    let mut setup = Setup::new(state, deployer, chain_id);
    let token = match token_code {
        Some(code) if cfg.kind.needs_token() => {
            let args =
                genesis::token_args("Overdrive Token", "ODT", U256::from(DEPLOYER_TOKEN_SUPPLY));
            Some(setup.deploy("deploy Token", code, &args)?)
        }
        _ => None,
    };
    let uniswap = match (uniswap_code, token_code) {
        (Some(uni), Some(token)) => {
            Some(genesis::deploy_uniswap(&mut setup, uni, token, cfg.pairs)?)
        }
        _ => None,
    };
    Ok((setup.finish(), token, uniswap))
}

/// The storage writes below assume OpenZeppelin's layout; the constructor's mint, executed by
/// revm, must have landed exactly where `erc20::balance_slot` says.
fn check_token(
    state: &MemState,
    token: Address,
    deployer: Address,
    code: &ContractCode,
) -> Result<(), WorkloadError> {
    let deployed = state.code_of(&token).original_bytes();
    if deployed != code.runtime {
        return Err(WorkloadError::ContractMismatch(
            "the deployed Token's runtime code differs from the artifact's deployedBytecode".into(),
        ));
    }
    let storage = state.accounts.get(&token).map(|a| &a.storage);
    let read = |slot| {
        storage
            .and_then(|s| s.get(&slot))
            .copied()
            .unwrap_or_default()
    };
    let supply = U256::from(DEPLOYER_TOKEN_SUPPLY);
    if read(erc20::balance_slot(deployer)) != supply || read(erc20::TOTAL_SUPPLY_SLOT) != supply {
        return Err(WorkloadError::ContractMismatch(
            "the Token constructor's mint is not at balance_slot(deployer) / TOTAL_SUPPLY_SLOT"
                .into(),
        ));
    }
    Ok(())
}

/// Writes the accounts' ETH, the main token's balances, and for every (sender, pair token) a
/// swap pays with, a balance covering those swaps plus an unlimited allowance for the router
/// (OpenZeppelin v5 never decrements `type(uint256).max`, as with real DEX approvals).
fn fund_accounts(
    state: &mut MemState,
    signers: &[Signer],
    token: Option<Address>,
    uniswap: Option<&UniswapDeployment>,
    plan: &[Vec<PlannedTx>],
) {
    state.accounts.reserve(signers.len());
    for signer in signers {
        state.insert_account(
            signer.address,
            U256::from(ACCOUNT_ETH),
            0,
            None,
            HashMap::default(),
        );
    }
    if let Some(token) = token {
        let slots: Vec<U256> = signers
            .par_iter()
            .map(|s| erc20::balance_slot(s.address))
            .collect();
        if let Some(account) = state.accounts.get_mut(&token) {
            account.storage.reserve(slots.len());
            for slot in slots {
                account.storage.insert(slot, U256::from(ACCOUNT_TOKENS));
            }
        }
        let minted = U256::from(ACCOUNT_TOKENS) * U256::from(signers.len());
        genesis::add_total_supply(state, token, minted);
    }
    let Some(uniswap) = uniswap else { return };
    // BTreeMap, not HashMap: iteration order must not depend on a random hasher seed.
    let mut spend: BTreeMap<(Address, Address), U256> = BTreeMap::new();
    for tx in plan.iter().flatten() {
        if let Action::Swap {
            pair,
            token0_in,
            amount_in,
        } = tx.action
        {
            let info = &uniswap.pairs[pair as usize];
            let token_in = if token0_in { info.token0 } else { info.token1 };
            *spend
                .entry((token_in, signers[tx.sender as usize].address))
                .or_default() += amount_in;
        }
    }
    for ((token, owner), amount) in spend {
        let balance = U256::from(SWAP_TOKEN_BASE) + amount;
        if let Some(account) = state.accounts.get_mut(&token) {
            *account
                .storage
                .entry(erc20::balance_slot(owner))
                .or_default() += balance;
            account
                .storage
                .insert(erc20::allowance_slot(owner, uniswap.router), U256::MAX);
        }
        genesis::add_total_supply(state, token, balance);
    }
}

fn gas_limit(action: &Action) -> u64 {
    match action {
        Action::Eth { .. } => TRANSFER_GAS,
        Action::Erc20 { .. } => ERC20_GAS,
        Action::Approve { .. } | Action::TransferFrom { .. } => ALLOWANCE_GAS,
        Action::Swap { .. } => SWAP_GAS,
        Action::Compute { rounds } => compute::gas_limit(*rounds),
    }
}

/// Where the planned actions' calls go.
struct Targets<'a> {
    token: Option<Address>,
    uniswap: Option<&'a UniswapDeployment>,
    chain_id: u64,
    /// Swaps call the router's fee-on-transfer variant (the router workload).
    fee_on_transfer_swaps: bool,
}

impl Targets<'_> {
    fn transaction(&self, tx: &PlannedTx, signers: &[Signer]) -> TxEip1559 {
        let account = |i: u32| signers[i as usize].address;
        let (to, value, input) = match tx.action {
            Action::Eth { to, value } => (account(to), value, Bytes::new()),
            Action::Erc20 { to, amount } => (
                self.token.unwrap_or_default(),
                U256::ZERO,
                erc20::encode_transfer(account(to), amount),
            ),
            Action::Approve { spender, amount } => (
                self.token.unwrap_or_default(),
                U256::ZERO,
                erc20::encode_approve(account(spender), amount),
            ),
            Action::TransferFrom { from, to, amount } => (
                self.token.unwrap_or_default(),
                U256::ZERO,
                erc20::encode_transfer_from(account(from), account(to), amount),
            ),
            Action::Swap {
                pair,
                token0_in,
                amount_in,
            } => {
                // Swaps are only planned when Uniswap was deployed; the defaults are unreachable.
                let router = self.uniswap.map(|u| u.router).unwrap_or_default();
                let info = self
                    .uniswap
                    .and_then(|u| u.pairs.get(pair as usize))
                    .copied()
                    .unwrap_or_default();
                let (token_in, token_out) = if token0_in {
                    (info.token0, info.token1)
                } else {
                    (info.token1, info.token0)
                };
                let swap = uniswap::Swap {
                    amount_in,
                    amount_out_min: U256::from(1u8),
                    token_in,
                    token_out,
                    to: account(tx.sender),
                    deadline: U256::MAX,
                };
                let input = if self.fee_on_transfer_swaps {
                    uniswap::encode_swap_fee_on_transfer(&swap)
                } else {
                    uniswap::encode_swap(&swap)
                };
                (router, U256::ZERO, input)
            }
            Action::Compute { rounds } => (compute::ADDRESS, U256::ZERO, compute::encode(rounds)),
        };
        TxEip1559 {
            chain_id: self.chain_id,
            nonce: tx.nonce,
            gas_limit: gas_limit(&tx.action),
            max_fee_per_gas: MAX_FEE_PER_GAS,
            max_priority_fee_per_gas: MAX_PRIORITY_FEE_PER_GAS,
            to: TxKind::Call(to),
            value,
            access_list: Default::default(),
            input,
        }
    }
}

fn build_blocks(
    cfg: &WorkloadConfig,
    plan: &[Vec<PlannedTx>],
    signers: &[Signer],
    targets: &Targets<'_>,
    genesis: &Header,
    gas_limit: u64,
) -> Vec<BlockWithSenders> {
    // Signing is the expensive part; it runs over all blocks at once and keeps plan order.
    let flat: Vec<&PlannedTx> = plan.iter().flatten().collect();
    let mut signed: Vec<Recovered<TxEnvelope>> = flat
        .par_iter()
        .map(|tx| {
            let signer = &signers[tx.sender as usize];
            Recovered::new_unchecked(
                signer.sign(targets.transaction(tx, signers)),
                signer.address,
            )
        })
        .collect();

    let mut blocks = Vec::with_capacity(plan.len());
    let mut parent_hash = genesis.hash_slow();
    let mut rest = signed.drain(..);
    for (i, txs) in plan.iter().enumerate() {
        let transactions: Vec<_> = rest.by_ref().take(txs.len()).collect();
        let number = genesis.number + 1 + i as u64;
        let transactions_root =
            alloy_trie::root::ordered_trie_root_with_encoder(&transactions, |tx, buf| {
                tx.inner().encode_2718(buf)
            });
        let header = Header {
            parent_hash,
            ommers_hash: EMPTY_OMMER_ROOT_HASH,
            beneficiary: COINBASE,
            transactions_root,
            number,
            gas_limit,
            timestamp: genesis.timestamp + BLOCK_TIME * (number - genesis.number),
            extra_data: Bytes::from_static(b"overdrive-workload"),
            mix_hash: block_value(cfg.seed, "prevrandao", number),
            base_fee_per_gas: Some(BASE_FEE),
            withdrawals_root: Some(EMPTY_WITHDRAWALS),
            blob_gas_used: Some(0),
            excess_blob_gas: Some(0),
            parent_beacon_block_root: Some(block_value(cfg.seed, "beacon root", number)),
            // No transaction deposits or calls the request contracts, so the request list is
            // known to be empty even before execution.
            requests_hash: Some(EMPTY_REQUESTS_HASH),
            ..Default::default()
        };
        let block =
            BlockWithSenders::from_parts(header, transactions, Vec::new(), Some(Vec::new()));
        parent_hash = block.hash;
        blocks.push(block);
    }
    blocks
}

/// A per-block pseudo-random word (prevrandao, beacon root) derived from the seed.
fn block_value(seed: u64, label: &str, number: u64) -> B256 {
    let mut preimage = label.as_bytes().to_vec();
    preimage.extend_from_slice(&seed.to_be_bytes());
    preimage.extend_from_slice(&number.to_be_bytes());
    keccak256(preimage)
}
