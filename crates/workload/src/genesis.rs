//! Builds the genesis state: contract deployments executed once with revm, then balances and
//! allowances written straight into storage.

use crate::{
    WorkloadError,
    abi::{erc20, uniswap},
    artifacts::{ContractCode, UniswapCode},
};
use alloy_genesis::GenesisAccount;
use alloy_primitives::{Address, B256, Bytes, TxKind, U256, map::HashMap};
use alloy_sol_types::SolValue;
use alloy_trie::{HashBuilder, Nibbles, TrieAccount};
use overdrive_primitives::MemState;
use rayon::prelude::*;
use revm::{
    Context, ExecuteCommitEvm, MainBuilder, MainContext,
    bytecode::Bytecode,
    context::{BlockEnv, TxEnv, result::ExecutionResult},
    database::{State, WrapDatabaseRef, states::bundle_state::BundleRetention},
    handler::{MainnetContext, MainnetEvm},
    primitives::{KECCAK_EMPTY, hardfork::SpecId},
};
use std::collections::BTreeMap;

/// Tokens the main ERC20's constructor mints to the deployer (a million, 18 decimals).
pub(crate) const DEPLOYER_TOKEN_SUPPLY: u128 = 1_000_000 * ETHER;
/// Liquidity on each side of every pair: a million tokens of 18 decimals, so the swaps
/// (at most 10 tokens) move prices by well under a percent each.
pub(crate) const PAIR_RESERVE: u128 = 1_000_000 * ETHER;
pub(crate) const ETHER: u128 = 1_000_000_000_000_000_000;
/// Gas of every setup transaction; setup runs at gas price zero, so this only has to be large
/// enough for a pair creation (~2.5M gas).
const SETUP_GAS: u64 = 30_000_000;

type SetupDb<'a> = State<WrapDatabaseRef<&'a MemState>>;

/// Executes the deployer's setup transactions one after another on top of a base state.
pub(crate) struct Setup<'a> {
    evm: MainnetEvm<MainnetContext<SetupDb<'a>>>,
    deployer: Address,
    nonce: u64,
    chain_id: u64,
}

impl<'a> Setup<'a> {
    pub(crate) fn new(base: &'a MemState, deployer: Address, chain_id: u64) -> Self {
        let db = State::builder()
            .with_database_ref(base)
            .with_bundle_update()
            .build();
        let nonce = base
            .accounts
            .get(&deployer)
            .map(|a| a.info.nonce)
            .unwrap_or_default();
        // Block 0's environment: the contracts read `chainid` (pair DOMAIN_SEPARATOR) and
        // `block.timestamp` (pair `blockTimestampLast`) exactly as the genesis will have them.
        let evm = Context::mainnet()
            .with_db(db)
            .modify_cfg_chained(|cfg| {
                cfg.set_spec_and_mainnet_gas_params(SpecId::PRAGUE);
                cfg.chain_id = chain_id;
            })
            .modify_block_chained(|block: &mut BlockEnv| {
                block.number = U256::ZERO;
                block.timestamp = U256::ZERO;
                block.basefee = 0;
                block.gas_limit = u64::MAX;
            })
            .build_mainnet();
        Self {
            evm,
            deployer,
            nonce,
            chain_id,
        }
    }

    fn transact(
        &mut self,
        step: &str,
        kind: TxKind,
        data: Bytes,
    ) -> Result<ExecutionResult, WorkloadError> {
        let tx = TxEnv::builder()
            .caller(self.deployer)
            .kind(kind)
            .data(data)
            .nonce(self.nonce)
            .gas_limit(SETUP_GAS)
            .gas_price(0)
            .chain_id(Some(self.chain_id))
            .build()
            .map_err(|e| setup_error(step, format!("{e:?}")))?;
        let result = self
            .evm
            .transact_commit(tx)
            .map_err(|e| setup_error(step, e.to_string()))?;
        self.nonce += 1;
        if !result.is_success() {
            return Err(setup_error(step, format!("{result:?}")));
        }
        Ok(result)
    }

    /// Deploys `code` with ABI-encoded constructor `args` and returns the new address.
    pub(crate) fn deploy(
        &mut self,
        step: &str,
        code: &ContractCode,
        args: &[u8],
    ) -> Result<Address, WorkloadError> {
        let expected = self.deployer.create(self.nonce);
        let initcode: Bytes = [code.creation.as_ref(), args].concat().into();
        let created = self
            .transact(step, TxKind::Create, initcode)?
            .created_address();
        if created != Some(expected) {
            return Err(setup_error(
                step,
                format!("created {created:?}, expected {expected}"),
            ));
        }
        Ok(expected)
    }

    /// Calls `to` and returns the output.
    pub(crate) fn call(
        &mut self,
        step: &str,
        to: Address,
        data: Bytes,
    ) -> Result<Bytes, WorkloadError> {
        let result = self.transact(step, TxKind::Call(to), data)?;
        Ok(result.into_output().unwrap_or_default())
    }

    /// The state changes of every setup transaction.
    pub(crate) fn finish(self) -> revm::database::BundleState {
        let mut db = self.evm.ctx.journaled_state.database;
        db.merge_transitions(BundleRetention::PlainState);
        db.take_bundle()
    }
}

fn setup_error(step: &str, reason: String) -> WorkloadError {
    WorkloadError::Setup {
        step: step.to_string(),
        reason,
    }
}

/// Constructor arguments of `Token(name, symbol, initialSupply)`.
pub(crate) fn token_args(name: &str, symbol: &str, supply: U256) -> Vec<u8> {
    (name.to_string(), symbol.to_string(), supply).abi_encode_params()
}

/// One deployed pair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PairInfo {
    /// The pair contract.
    pub address: Address,
    /// The pair's `token0` (the lower address).
    pub token0: Address,
    /// The pair's `token1`.
    pub token1: Address,
}

/// The Uniswap V2 deployment of a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UniswapDeployment {
    /// `UniswapV2Factory` (its `feeToSetter` is the deployer; the protocol fee is off).
    pub factory: Address,
    /// `UniswapV2Router02`, which every generated swap calls.
    pub router: Address,
    /// `WETH9`, the router's WETH (unused by token-for-token swaps).
    pub weth: Address,
    /// Every pair, each over two tokens of its own; pair 0 is the hybrid workload's hot pair.
    pub pairs: Vec<PairInfo>,
}

/// Deploys WETH, the factory, the router and `pairs` pairs with liquidity, all by executing
/// the real constructors and calls.
///
/// Swaps go through the router (`swapExactTokensForTokens`): the router finds pairs with
/// `UniswapV2Library.pairFor`, a CREATE2 address over a hard-coded init-code hash, and the
/// published v2-core 1.0.1 pair bytecode does hash to it. That is checked here twice (the
/// artifact's hash, and every pair's actual address against `pairFor`), so a mismatching
/// artifact fails generation instead of producing swaps that revert.
pub(crate) fn deploy_uniswap(
    setup: &mut Setup<'_>,
    code: &UniswapCode,
    token: &ContractCode,
    pairs: usize,
) -> Result<UniswapDeployment, WorkloadError> {
    let pair_hash = alloy_primitives::keccak256(&code.pair.creation);
    if pair_hash != uniswap::INIT_CODE_HASH {
        return Err(WorkloadError::ContractMismatch(format!(
            "UniswapV2Pair creation code hashes to {pair_hash}, the router expects {}",
            uniswap::INIT_CODE_HASH
        )));
    }
    let deployer = setup.deployer;
    let weth = setup.deploy("deploy WETH9", &code.weth, &[])?;
    let factory = setup.deploy(
        "deploy UniswapV2Factory",
        &code.factory,
        &deployer.abi_encode(),
    )?;
    let router = setup.deploy(
        "deploy UniswapV2Router02",
        &code.router,
        &(factory, weth).abi_encode_params(),
    )?;
    let reserve = U256::from(PAIR_RESERVE);
    let mut infos = Vec::with_capacity(pairs);
    for p in 0..pairs {
        let a = setup.deploy(
            &format!("deploy pair {p} token A"),
            token,
            &token_args(&format!("Pair {p} A"), "PA", reserve),
        )?;
        let b = setup.deploy(
            &format!("deploy pair {p} token B"),
            token,
            &token_args(&format!("Pair {p} B"), "PB", reserve),
        )?;
        setup.call(
            &format!("create pair {p}"),
            factory,
            uniswap::encode_create_pair(a, b),
        )?;
        let address = uniswap::pair_address(factory, a, b);
        // Liquidity the way a real LP adds it: tokens to the pair, then `mint`.
        setup.call(
            &format!("fund pair {p} with A"),
            a,
            erc20::encode_transfer(address, reserve),
        )?;
        setup.call(
            &format!("fund pair {p} with B"),
            b,
            erc20::encode_transfer(address, reserve),
        )?;
        setup.call(
            &format!("mint pair {p}"),
            address,
            uniswap::encode_mint(deployer),
        )?;
        let (token0, token1) = uniswap::sort_tokens(a, b);
        infos.push(PairInfo {
            address,
            token0,
            token1,
        });
    }
    // `createPair` returned quietly even if the pair landed elsewhere; `getReserves` on the
    // address the router will use proves the pair is there and funded.
    if let Some(first) = infos.first() {
        let out = setup.call(
            "check pair 0 reserves",
            first.address,
            uniswap::encode_get_reserves(),
        )?;
        let expected = (reserve, reserve).abi_encode_params();
        if out.len() != 96 || out[..64] != expected[..] {
            return Err(WorkloadError::ContractMismatch(format!(
                "pair 0 is not at the router's pairFor address {} (getReserves returned {out})",
                first.address
            )));
        }
    }
    Ok(UniswapDeployment {
        factory,
        router,
        weth,
        pairs: infos,
    })
}

/// Adds `delta` to an ERC20's `_totalSupply`.
pub(crate) fn add_total_supply(state: &mut MemState, token: Address, delta: U256) {
    if let Some(account) = state.accounts.get_mut(&token) {
        let supply = account.storage.entry(erc20::TOTAL_SUPPLY_SLOT).or_default();
        *supply += delta;
    }
}

/// Re-creates every bytecode from its raw bytes, so the state compares equal to one loaded
/// from the genesis allocation (`MemState::from_alloc`), whatever form revm stored it in.
pub(crate) fn normalize_code(state: &mut MemState) {
    for code in state.contracts.values_mut() {
        *code = Bytecode::new_raw(code.original_bytes());
    }
}

/// The state root of `state`, by alloy-trie's `HashBuilder` (the reference implementation);
/// storage roots are computed in parallel because one token can hold a million slots.
pub(crate) fn state_root(state: &MemState) -> B256 {
    let mut leaves: Vec<(B256, TrieAccount)> = state
        .accounts
        .par_iter()
        .map(|(address, account)| {
            let storage_root = storage_root(&account.storage);
            let info = &account.info;
            let trie = TrieAccount {
                nonce: info.nonce,
                balance: info.balance,
                storage_root,
                code_hash: info.code_hash,
            };
            (alloy_primitives::keccak256(address), trie)
        })
        .collect();
    leaves.par_sort_unstable_by_key(|(key, _)| *key);
    let mut hb = HashBuilder::default();
    let mut buf = Vec::new();
    for (key, account) in &leaves {
        buf.clear();
        alloy_rlp::Encodable::encode(account, &mut buf);
        hb.add_leaf(Nibbles::unpack(key), &buf);
    }
    hb.root()
}

fn storage_root(storage: &HashMap<U256, U256>) -> B256 {
    let mut slots: Vec<(B256, U256)> = if storage.len() > 4096 {
        storage
            .par_iter()
            .map(|(k, v)| (alloy_primitives::keccak256(k.to_be_bytes::<32>()), *v))
            .collect()
    } else {
        storage
            .iter()
            .map(|(k, v)| (alloy_primitives::keccak256(k.to_be_bytes::<32>()), *v))
            .collect()
    };
    slots.par_sort_unstable_by_key(|(key, _)| *key);
    let mut hb = HashBuilder::default();
    for (key, value) in slots.iter().filter(|(_, v)| !v.is_zero()) {
        hb.add_leaf(Nibbles::unpack(key), &alloy_rlp::encode_fixed_size(value));
    }
    hb.root()
}

/// The genesis allocation holding exactly `state`'s accounts. Entries are converted and
/// sorted in parallel; `BTreeMap` then bulk-builds from the sorted run.
pub(crate) fn to_alloc(state: &MemState) -> BTreeMap<Address, GenesisAccount> {
    let mut entries: Vec<(Address, GenesisAccount)> = state
        .accounts
        .par_iter()
        .map(|(address, account)| {
            let info = &account.info;
            let code = (info.code_hash != KECCAK_EMPTY)
                .then(|| {
                    state
                        .contracts
                        .get(&info.code_hash)
                        .map(|c| c.original_bytes())
                })
                .flatten();
            let storage = (!account.storage.is_empty()).then(|| {
                let mut slots: Vec<(B256, B256)> = account
                    .storage
                    .par_iter()
                    .map(|(k, v)| (B256::from(*k), B256::from(*v)))
                    .collect();
                slots.par_sort_unstable_by_key(|(k, _)| *k);
                slots.into_iter().collect::<BTreeMap<_, _>>()
            });
            let genesis = GenesisAccount {
                nonce: (info.nonce != 0).then_some(info.nonce),
                balance: info.balance,
                code,
                storage,
                private_key: None,
            };
            (*address, genesis)
        })
        .collect();
    entries.par_sort_unstable_by_key(|(address, _)| *address);
    entries.into_iter().collect()
}
