//! Dependency hints known before execution: from each transaction's sender, recipient and
//! value, from the decoded calldata of ERC20 `transfer`/`transferFrom`/`approve` and Uniswap
//! V2 `swapExactTokensForTokens`, and from the conflicts found while executing. They only steer
//! scheduling (which transaction waits for which); a wrong or missing hint costs a
//! re-execution, never correctness.
//!
//! Calls of a contract whose calldata the hints cannot decode are not ordered by default (two
//! users of a router rarely touch the same slots). The DAG is refined as conflicts are found:
//! once the calls of such a contract fail validation often (at least [`CHAIN_MIN_CONFLICTS`],
//! and one in [`CHAIN_ONE_IN`] of those checked so far), every later call of it in the block
//! waits for the previous one (`BlockHints::conflict_dep`), and the executor remembers the
//! contract for the next blocks, whose hints then chain its calls from the start (`learned`).
//! A rare conflict does not chain: a router whose swaps meet on one pair now and then is
//! faster re-executing those few than running every swap in one chain.

use super::mv::TxIdx;
use alloy_consensus::{Transaction, TxEnvelope, transaction::Recovered};
use alloy_primitives::{
    Address, Bytes, TxKind, U256,
    map::{DefaultHashBuilder, HashMap},
};
use std::{
    hash::BuildHasher,
    sync::atomic::{AtomicBool, AtomicU32, Ordering},
};

/// Contracts whose undecodable calls conflicted often in recent blocks: their calls are
/// chained from the start of a block.
pub(crate) type LearnedConflicts = alloy_primitives::map::HashSet<Address>;

/// A conflict key. ERC20 slots are keyed by (token, owner[, spender]) rather than by the
/// keccak slot the contract uses: the key only has to be equal exactly when the slot is, and
/// skipping two or three keccaks per transaction keeps hinting cheap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum HintKey {
    /// Nonce and balance of an account.
    Account(Address),
    /// `balances[owner]` of a token (OpenZeppelin layout: mapping at slot 0).
    Balance { token: Address, owner: Address },
    /// `allowances[owner][spender]` of a token (mapping at slot 1).
    Allowance {
        token: Address,
        owner: Address,
        spender: Address,
    },
    /// The reserves (and token balances) of the Uniswap V2 pair of two tokens.
    Pair(Address, Address),
    /// Storage of a contract called with calldata we cannot decode.
    Contract(Address),
}

impl HintKey {
    /// The contract whose storage holds the key's slot, when the key is one slot.
    fn slot_of(&self) -> Option<Address> {
        match self {
            Self::Balance { token, .. } | Self::Allowance { token, .. } => Some(*token),
            Self::Account(_) | Self::Pair(..) | Self::Contract(_) => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Reads and writes the value: ordered after every earlier access.
    Strict,
    /// Only adds to a balance (a lazy increment): needs no order among its kind, so a strict
    /// access after several waits for each of them, not only the last.
    Additive,
}

const TRANSFER: [u8; 4] = [0xa9, 0x05, 0x9c, 0xbb];
const TRANSFER_FROM: [u8; 4] = [0x23, 0xb8, 0x72, 0xdd];
const APPROVE: [u8; 4] = [0x09, 0x5e, 0xa7, 0xb3];
const SWAP_EXACT_TOKENS_FOR_TOKENS: [u8; 4] = [0x38, 0xed, 0x17, 0x39];

/// Hints of a whole block.
#[derive(Debug, Default)]
pub(crate) struct BlockHints {
    /// Earlier transactions each transaction should wait for before it runs.
    pub deps: Vec<Vec<TxIdx>>,
    /// The recipient whose balance a transaction may credit lazily (a plain transfer to a hot
    /// recipient), if any.
    pub lazy_recipient: Vec<Option<Address>>,
    /// Whether a transaction's speculative writes are worth publishing to the multi-version
    /// memory: some later transaction is hinted to depend on it, it credits lazily (a later
    /// reader must see every credit), or it calls code whose writes the hints cannot tell.
    /// The writes of the others would only be read by a transaction the hints missed, whose
    /// stale read the committer catches anyway; publishing them would only add to every
    /// transaction's time.
    pub publish: Vec<bool>,
    /// Length of the longest chain of hinted dependencies (transactions that must run one
    /// after the other).
    pub longest_chain: usize,
    /// Contracts whose storage the block is hinted to change in at least [`MANY_SLOTS`]
    /// distinct slots, with that count: the committer sizes their storage maps up front.
    pub many_slots: Vec<(Address, usize)>,
    /// Per transaction, a call of a contract whose calldata the hints cannot decode and whose
    /// calls are not chained (not `learned`): the contract's index in `called`, and the
    /// block's previous call of the same contract.
    pub calls: Vec<Option<(u32, Option<TxIdx>)>>,
    /// The contracts of `calls`, each with how its calls fared in validation so far.
    pub called: Vec<(Address, CallConflicts)>,
}

/// Chain a contract's undecoded calls once at least this many have failed validation...
/// (A few, so that two early conflicts of a contract whose calls rarely meet do not chain it.)
pub(crate) const CHAIN_MIN_CONFLICTS: u32 = 4;
/// ...and at least one in this many of those validated so far. On the router workload, swaps over
/// two pairs, which conflict in a third of their validations, still gain from speculation over one
/// chain; over one pair nearly all conflict, and one chain is faster on less CPU.
pub(crate) const CHAIN_ONE_IN: u32 = 2;

/// How one contract's undecoded calls fared in validation in this block. Written by the
/// committer and by pool threads that find a result stale, read by the scheduler; it only
/// steers, so relaxed.
#[derive(Debug, Default)]
pub(crate) struct CallConflicts {
    checked: AtomicU32,
    conflicts: AtomicU32,
    /// The block's later calls wait for each other.
    chained: AtomicBool,
}

impl BlockHints {
    /// The dependency found while executing: the previous call of the same contract, once
    /// that contract's calls are chained.
    pub(crate) fn conflict_dep(&self, tx: TxIdx) -> Option<TxIdx> {
        let (contract, previous) = self.calls.get(tx as usize).copied().flatten()?;
        let (_, found) = &self.called[contract as usize];
        previous.filter(|_| found.chained.load(Ordering::Relaxed))
    }

    /// Records whether `tx`'s speculative result passed validation, or was found stale (a
    /// conflict) by a pool thread before validation; when its contract's calls (if it is an
    /// undecoded call) conflict often enough, from now on they wait for each other.
    ///
    /// Stale results a pool thread executes again count, or a contract whose every call
    /// conflicts would rarely fail validation and never be chained: its calls would go on
    /// running out of order and being executed again in waves (`--pairs 1` on the router
    /// workload: 2.4 executions per transaction).
    pub(crate) fn call_checked(&self, tx: TxIdx, conflicted: bool) {
        let Some((contract, _)) = self.calls.get(tx as usize).copied().flatten() else {
            return;
        };
        let found = &self.called[contract as usize].1;
        let checked = found.checked.fetch_add(1, Ordering::Relaxed) + 1;
        let conflicts = found
            .conflicts
            .fetch_add(u32::from(conflicted), Ordering::Relaxed)
            + u32::from(conflicted);
        if conflicts >= CHAIN_MIN_CONFLICTS && conflicts.saturating_mul(CHAIN_ONE_IN) >= checked {
            found.chained.store(true, Ordering::Relaxed);
        }
    }

    /// The contracts whose calls were chained in this block.
    pub(crate) fn conflicted(&self) -> impl Iterator<Item = Address> + '_ {
        self.called
            .iter()
            .filter(|(_, found)| found.chained.load(Ordering::Relaxed))
            .map(|(contract, _)| *contract)
    }

    /// Records the next transaction's (`j`'s) dependencies — the earlier transactions it found
    /// on its keys, in any order and with repeats — with its chain depth in `depth` (one entry
    /// per transaction recorded so far), and marks each transaction it waits for as publishing.
    fn push_deps(&mut self, j: TxIdx, mut deps: Vec<TxIdx>, depth: &mut Vec<u32>) {
        // A transaction touching one key twice (a transfer to itself) must not wait for itself.
        deps.retain(|&p| p != j);
        deps.sort_unstable();
        deps.dedup();
        let d = 1 + deps.iter().map(|&p| depth[p as usize]).max().unwrap_or(0);
        depth.push(d);
        self.longest_chain = self.longest_chain.max(d as usize);
        for &p in &deps {
            self.publish[p as usize] = true;
        }
        self.deps.push(deps);
    }
}

/// See [`BlockHints::many_slots`].
pub(crate) const MANY_SLOTS: usize = 256;

fn word(input: &Bytes, index: usize) -> Option<&[u8]> {
    input.get(4 + 32 * index..4 + 32 * (index + 1))
}

fn address_arg(input: &Bytes, index: usize) -> Option<Address> {
    word(input, index).map(|w| Address::from_slice(&w[12..]))
}

fn usize_arg(input: &Bytes, index: usize) -> Option<usize> {
    let w = word(input, index)?;
    let v = U256::from_be_slice(w);
    (v < U256::from(1u64 << 32)).then(|| v.to::<usize>())
}

/// The token path of `swapExactTokensForTokens(amountIn, amountOutMin, path, to, deadline)`.
fn swap_path(input: &Bytes) -> Option<Vec<Address>> {
    let offset = usize_arg(input, 2)?;
    let len_word = input.get(4 + offset..4 + offset + 32)?;
    let len = U256::from_be_slice(len_word);
    if len > U256::from(8) {
        return None;
    }
    (0..len.to::<usize>())
        .map(|i| {
            let start = 4 + offset + 32 + 32 * i;
            input.get(start + 12..start + 32).map(Address::from_slice)
        })
        .collect()
}

fn sorted(a: Address, b: Address) -> (Address, Address) {
    if a <= b { (a, b) } else { (b, a) }
}

/// The keys a transaction touches, with its lazily credited recipient. A call whose calldata
/// cannot be decoded is keyed by its contract (chained with the block's other calls of it)
/// when `learned` says so (`None`: always), and otherwise left for `call` to report.
fn tx_keys(
    tx: &Recovered<TxEnvelope>,
    hot: u32,
    lazy_recipients: bool,
    learned: Option<&LearnedConflicts>,
    keys: &mut Vec<(HintKey, Mode)>,
    call: &mut Option<Address>,
) -> Option<Address> {
    let mut undecoded = |to: Address, keys: &mut Vec<(HintKey, Mode)>| {
        if learned.is_none_or(|learned| learned.contains(&to)) {
            keys.push((HintKey::Contract(to), Mode::Strict));
        } else {
            *call = Some(to);
        }
    };
    let sender = tx.signer();
    keys.push((HintKey::Account(sender), Mode::Strict));
    let TxKind::Call(to) = tx.kind() else {
        return None;
    };
    let input = tx.input();
    if input.is_empty() || input.len() < 4 {
        // A plain transfer (or a call of a contract's fallback).
        if is_lazy_candidate(tx, to, hot, lazy_recipients) {
            keys.push((HintKey::Account(to), Mode::Additive));
            return Some(to);
        }
        keys.push((HintKey::Account(to), Mode::Strict));
        return None;
    }
    if !tx.value().is_zero() {
        keys.push((HintKey::Account(to), Mode::Strict));
    }
    let selector: [u8; 4] = input[..4].try_into().unwrap_or_default();
    let balance = |owner| (HintKey::Balance { token: to, owner }, Mode::Strict);
    match selector {
        TRANSFER if input.len() >= 68 => {
            keys.push(balance(sender));
            keys.extend(address_arg(input, 0).map(balance));
        }
        TRANSFER_FROM if input.len() >= 100 => {
            if let (Some(from), Some(recipient)) = (address_arg(input, 0), address_arg(input, 1)) {
                keys.push(balance(from));
                keys.push(balance(recipient));
                keys.push((
                    HintKey::Allowance {
                        token: to,
                        owner: from,
                        spender: sender,
                    },
                    Mode::Strict,
                ));
            }
        }
        APPROVE if input.len() >= 68 => {
            if let Some(spender) = address_arg(input, 0) {
                keys.push((
                    HintKey::Allowance {
                        token: to,
                        owner: sender,
                        spender,
                    },
                    Mode::Strict,
                ));
            }
        }
        SWAP_EXACT_TOKENS_FOR_TOKENS => match (swap_path(input), address_arg(input, 3)) {
            (Some(path), Some(recipient)) if path.len() >= 2 => {
                let first = path[0];
                keys.push((
                    HintKey::Balance {
                        token: first,
                        owner: sender,
                    },
                    Mode::Strict,
                ));
                keys.push((
                    HintKey::Allowance {
                        token: first,
                        owner: sender,
                        spender: to,
                    },
                    Mode::Strict,
                ));
                for pair in path.windows(2) {
                    let (a, b) = sorted(pair[0], pair[1]);
                    keys.push((HintKey::Pair(a, b), Mode::Strict));
                }
                let last = path[path.len() - 1];
                keys.push((
                    HintKey::Balance {
                        token: last,
                        owner: recipient,
                    },
                    Mode::Strict,
                ));
            }
            _ => undecoded(to, keys),
        },
        _ => undecoded(to, keys),
    }
    None
}

/// `hot`: how many plain value transfers of the block go to `to`.
fn is_lazy_candidate(
    tx: &Recovered<TxEnvelope>,
    to: Address,
    hot: u32,
    lazy_recipients: bool,
) -> bool {
    lazy_recipients
        && !tx.value().is_zero()
        && to != tx.signer()
        && tx.authorization_list().is_none_or(|l| l.is_empty())
        && hot >= 2
        // Precompiles live at low addresses and run code although they have none.
        && to.0[..18].iter().any(|b| *b != 0)
}

/// How many keys ahead of its use a table slot is prefetched.
const AHEAD: usize = 8;

/// A transaction that may credit `to` lazily: a call of `to` without a selector.
fn short_call(tx: &Recovered<TxEnvelope>) -> Option<Address> {
    match tx.kind() {
        TxKind::Call(to) if tx.input().len() < 4 => Some(to),
        _ => None,
    }
}

/// For each transaction, how many plain value transfers of the block go to its recipient, if
/// it may credit that recipient lazily (0 otherwise). `coinbase` is never counted: its balance
/// is handled by the deferred fee instead.
fn hot_counts(
    txs: &[Recovered<TxEnvelope>],
    coinbase: Address,
    seed: &DefaultHashBuilder,
) -> Vec<u32> {
    let mut counts = vec![0; txs.len()];
    let transfers: Vec<(u64, Address)> = txs
        .iter()
        .filter_map(|tx| match tx.kind() {
            TxKind::Call(to)
                if tx.input().is_empty() && !tx.value().is_zero() && to != coinbase =>
            {
                Some((seed.hash_one(to), to))
            }
            _ => None,
        })
        .collect();
    let mut table = Table::new(transfers.len(), (Address::ZERO, 0u32));
    let free = |slot: &(Address, u32)| slot.1 == 0;
    for (i, &(hash, to)) in transfers.iter().enumerate() {
        if let Some(&(ahead, _)) = transfers.get(i + AHEAD) {
            table.prefetch(ahead);
        }
        let slot = table.slot(hash, |s| free(s) || s.0 == to);
        *slot = (to, slot.1 + 1);
    }
    let lookups: Vec<(usize, u64, Address)> = txs
        .iter()
        .enumerate()
        .filter_map(|(j, tx)| short_call(tx).map(|to| (j, seed.hash_one(to), to)))
        .collect();
    for (i, &(j, hash, to)) in lookups.iter().enumerate() {
        if let Some(&(_, ahead, _)) = lookups.get(i + AHEAD) {
            table.prefetch(ahead);
        }
        // Probing stops at a free slot (count 0) when `to` was never counted.
        counts[j] = table.slot(hash, |s| free(s) || s.0 == to).1;
    }
    counts
}

/// An open-addressing table (linear probing) whose slots are found from a 64-bit hash of the key,
/// sized for at most `keys` keys at a load of two thirds or less. Unlike a `HashMap`'s, the slot a
/// key probes first is known before the key is looked up, so it can be prefetched while earlier
/// keys are processed: a block's tables are fresh memory, and in transaction order nearly every key
/// is a cache miss (a large share of the hints' time before this table).
struct Table<T> {
    slots: Vec<T>,
    mask: usize,
}

impl<T: Copy> Table<T> {
    fn new(keys: usize, free: T) -> Self {
        let len = (keys + keys / 2 + 1).next_power_of_two();
        Self {
            slots: vec![free; len],
            mask: len - 1,
        }
    }

    fn prefetch(&self, hash: u64) {
        let slot = &self.slots[hash as usize & self.mask];
        overdrive_primitives::prefetch((slot as *const T).cast(), 1);
    }

    /// The first slot from `hash`'s that is the key's or free (`found` tells which).
    fn slot(&mut self, hash: u64, found: impl Fn(&T) -> bool) -> &mut T {
        let mut i = hash as usize & self.mask;
        // Terminates: the table is never full (sized above its key count).
        while !found(&self.slots[i]) {
            i = (i + 1) & self.mask;
        }
        &mut self.slots[i]
    }
}

/// Builds the hints of a block. `coinbase` never becomes a lazy recipient: its balance is
/// handled by the deferred fee instead. `learned`: see [`tx_keys`].
pub(crate) fn build(
    txs: &[Recovered<TxEnvelope>],
    coinbase: Address,
    lazy_recipients: bool,
    learned: Option<&LearnedConflicts>,
) -> BlockHints {
    let seed = DefaultHashBuilder::default();
    // Recipients of plain value transfers, counted: two or more in a block make one hot.
    let hot = if lazy_recipients {
        hot_counts(txs, coinbase, &seed)
    } else {
        vec![0; txs.len()]
    };
    // Every transaction's keys, replaced by a seeded 64-bit hash of them (never 0, which marks
    // a free slot): the table stays small enough for the cache, and a collision only adds a
    // needless dependency (hints steer, they never decide).
    // The third field indexes `contracts` for a storage slot's key (`NOT_A_SLOT` otherwise),
    // to count each contract's distinct slots.
    const NOT_A_SLOT: u32 = u32::MAX;
    let mut hashed: Vec<(u64, Mode, u32)> = Vec::with_capacity(txs.len() * 3);
    let mut contracts: Vec<(Address, usize)> = Vec::new();
    let mut contract_index: HashMap<Address, u32> = HashMap::default();
    let mut ends = Vec::with_capacity(txs.len());
    let mut hints = BlockHints {
        deps: Vec::with_capacity(txs.len()),
        lazy_recipient: Vec::with_capacity(txs.len()),
        publish: Vec::with_capacity(txs.len()),
        longest_chain: 0,
        many_slots: Vec::new(),
        calls: Vec::with_capacity(txs.len()),
        called: Vec::new(),
    };
    // Per undecoded contract: its index in `called` and its latest call so far.
    let mut calls: HashMap<Address, (u32, TxIdx)> = HashMap::default();
    let mut keys = Vec::new();
    for (j, (tx, &hot)) in txs.iter().zip(&hot).enumerate() {
        keys.clear();
        let mut call = None;
        hints.lazy_recipient.push(tx_keys(
            tx,
            hot,
            lazy_recipients,
            learned,
            &mut keys,
            &mut call,
        ));
        hints.publish.push(
            call.is_some()
                || keys.iter().any(|(key, mode)| {
                    *mode == Mode::Additive || matches!(key, HintKey::Contract(_))
                }),
        );
        hints.calls.push(call.map(|to| {
            let (index, latest) = calls.entry(to).or_insert_with(|| {
                hints.called.push((to, CallConflicts::default()));
                (hints.called.len() as u32 - 1, TxIdx::MAX)
            });
            let previous = (*latest != TxIdx::MAX).then_some(*latest);
            *latest = j as TxIdx;
            (*index, previous)
        }));
        hashed.extend(keys.iter().map(|(key, mode)| {
            let contract = key.slot_of().map_or(NOT_A_SLOT, |contract| {
                *contract_index.entry(contract).or_insert_with(|| {
                    contracts.push((contract, 0));
                    contracts.len() as u32 - 1
                })
            });
            (seed.hash_one(key).max(1), *mode, contract)
        }));
        ends.push(hashed.len());
    }
    // (hash, last strict access, last access of any mode, index in `additive`) per key,
    // `NONE` for none.
    const NONE: TxIdx = TxIdx::MAX;
    let mut last = Table::new(hashed.len(), (0u64, NONE, NONE, NONE));
    // Per key with additive accesses, those since its last strict one: unordered among
    // themselves, each must be waited for by the next strict access.
    let mut additive: Vec<Vec<TxIdx>> = Vec::new();
    // Length of the longest dependency chain ending at each transaction.
    let mut depth: Vec<u32> = Vec::with_capacity(txs.len());
    let mut start = 0;
    for (j, &end) in ends.iter().enumerate() {
        let j = j as TxIdx;
        let mut deps: Vec<TxIdx> = Vec::new();
        for k in start..end {
            if let Some(&(ahead, ..)) = hashed.get(k + AHEAD) {
                last.prefetch(ahead);
            }
            let (hash, mode, contract) = hashed[k];
            let entry = last.slot(hash, |s| s.0 == 0 || s.0 == hash);
            if entry.0 == 0
                && let Some((_, slots)) = contracts.get_mut(contract as usize)
            {
                *slots += 1;
            }
            entry.0 = hash;
            match mode {
                Mode::Strict => {
                    deps.extend(Some(entry.2).filter(|&p| p != NONE));
                    if let Some(since) = additive.get_mut(entry.3 as usize) {
                        deps.append(since);
                    }
                    (entry.1, entry.2) = (j, j);
                }
                Mode::Additive => {
                    deps.extend(Some(entry.1).filter(|&p| p != NONE));
                    if entry.3 == NONE {
                        entry.3 = additive.len() as TxIdx;
                        additive.push(Vec::new());
                    }
                    additive[entry.3 as usize].push(j);
                    entry.2 = j;
                }
            }
        }
        start = end;
        hints.push_deps(j, deps, &mut depth);
    }
    hints.many_slots = contracts
        .into_iter()
        .filter(|(_, slots)| *slots >= MANY_SLOTS)
        .collect();
    hints
}

#[cfg(test)]
mod tests {
    use super::*;

    use overdrive_workload::{WorkloadConfig, WorkloadKind, generate};

    /// The hints by their definition: exact keys in a `HashMap`, nothing prefetched.
    fn reference(txs: &[Recovered<TxEnvelope>], coinbase: Address, lazy: bool) -> BlockHints {
        let mut transfers: HashMap<Address, u32> = HashMap::default();
        for tx in txs {
            if let TxKind::Call(to) = tx.kind()
                && lazy
                && tx.input().is_empty()
                && !tx.value().is_zero()
                && to != coinbase
            {
                *transfers.entry(to).or_default() += 1;
            }
        }
        // Per key: the last strict access, the last access, the additive ones since the last
        // strict one.
        type Accesses = (Option<TxIdx>, Option<TxIdx>, Vec<TxIdx>);
        let mut last: HashMap<HintKey, Accesses> = HashMap::default();
        let mut slots: HashMap<Address, usize> = HashMap::default();
        let mut hints = BlockHints::default();
        let mut depth = Vec::new();
        for (j, tx) in txs.iter().enumerate() {
            let j = j as TxIdx;
            let hot = short_call(tx).and_then(|to| transfers.get(&to).copied());
            let mut keys = Vec::new();
            hints.lazy_recipient.push(tx_keys(
                tx,
                hot.unwrap_or(0),
                lazy,
                None,
                &mut keys,
                &mut None,
            ));
            hints.publish.push(
                keys.iter()
                    .any(|(k, m)| *m == Mode::Additive || matches!(k, HintKey::Contract(_))),
            );
            let mut deps = Vec::new();
            for (key, mode) in keys {
                if !last.contains_key(&key)
                    && let Some(contract) = key.slot_of()
                {
                    *slots.entry(contract).or_default() += 1;
                }
                let (strict, any, since) = last.entry(key).or_default();
                match mode {
                    Mode::Strict => {
                        deps.extend(*any);
                        deps.append(since);
                        (*strict, *any) = (Some(j), Some(j));
                    }
                    Mode::Additive => {
                        deps.extend(*strict);
                        since.push(j);
                        *any = Some(j);
                    }
                }
            }
            hints.push_deps(j, deps, &mut depth);
        }
        hints.many_slots = slots
            .into_iter()
            .filter(|(_, n)| *n >= MANY_SLOTS)
            .collect();
        hints.many_slots.sort_unstable();
        hints
    }

    /// A legacy call from `sender` (signature not checked: hints only read the sender).
    fn legacy(sender: u8, to: Address, value: u64, input: Vec<u8>) -> Recovered<TxEnvelope> {
        let tx = alloy_consensus::TxLegacy {
            to: TxKind::Call(to),
            value: U256::from(value),
            input: input.into(),
            gas_limit: 100_000,
            ..Default::default()
        };
        let signed = alloy_consensus::Signed::new_unhashed(
            tx,
            alloy_primitives::Signature::test_signature(),
        );
        Recovered::new_unchecked(TxEnvelope::Legacy(signed), Address::repeat_byte(sender))
    }

    /// A call without value.
    fn call(sender: u8, to: Address, input: Vec<u8>) -> Recovered<TxEnvelope> {
        legacy(sender, to, 0, input)
    }

    /// A plain value transfer.
    fn pay(sender: u8, to: Address) -> Recovered<TxEnvelope> {
        legacy(sender, to, 1, Vec::new())
    }

    /// Lazy credits run unordered among themselves, so the recipient's next strict access (it
    /// sends) waits for every credit since the last strict one, not only the last credit: it
    /// ran beside an earlier credit and failed validation.
    #[test]
    fn a_strict_access_waits_for_every_lazy_credit_before_it() {
        let hot = Address::repeat_byte(7);
        let txs = vec![
            pay(1, hot),
            pay(2, hot),
            pay(3, hot),
            pay(7, Address::repeat_byte(9)),
            pay(4, hot),
            pay(7, Address::repeat_byte(9)),
        ];
        let hints = build(&txs, Address::ZERO, true, None);
        assert_eq!(hints.lazy_recipient[..3], [Some(hot); 3]);
        assert!(
            hints.deps[..3].iter().all(Vec::is_empty),
            "{:?}",
            hints.deps
        );
        assert_eq!(hints.deps[3], [0, 1, 2]);
        // After the strict access, a credit waits for it, and the next strict access for the
        // credit (and so for both).
        assert_eq!(hints.deps[4], [3]);
        assert_eq!(hints.deps[5], [4]);
        assert_eq!(hints.deps, reference(&txs, Address::ZERO, true).deps);
    }

    /// Undecoded calls run unordered until their conflicts are frequent; then the rest of the
    /// block's calls of that contract wait for each other. A learned contract is chained from
    /// the start.
    #[test]
    fn undecoded_calls_are_chained_once_they_conflict() {
        let (router, other) = (Address::repeat_byte(0xaa), Address::repeat_byte(0xbb));
        let txs = vec![
            call(1, router, vec![1, 2, 3, 4]),
            call(2, other, vec![1, 2, 3, 4]),
            call(3, router, vec![9, 9, 9, 9, 9]),
            call(4, Address::repeat_byte(9), Vec::new()),
            call(5, router, vec![1, 2, 3, 4]),
            call(6, router, vec![1, 2, 3, 4]),
        ];
        let hints = build(
            &txs,
            Address::ZERO,
            true,
            Some(&LearnedConflicts::default()),
        );
        assert!(hints.deps.iter().all(Vec::is_empty), "{:?}", hints.deps);
        assert_eq!(
            hints.calls,
            [
                Some((0, None)),
                Some((1, None)),
                Some((0, Some(0))),
                None,
                Some((0, Some(2))),
                Some((0, Some(4))),
            ]
        );
        assert_eq!(hints.longest_chain, 1);
        assert!((0..6).all(|j| hints.conflict_dep(j).is_none()));
        assert_eq!(hints.publish, [true, true, true, false, true, true]);
        let chained =
            |hints: &BlockHints| (0..6).map(|j| hints.conflict_dep(j)).collect::<Vec<_>>();
        // A few conflicts of the router's calls are not enough...
        hints.call_checked(0, false);
        for _ in 1..CHAIN_MIN_CONFLICTS {
            hints.call_checked(2, true);
        }
        assert!(chained(&hints).iter().all(Option::is_none));
        // ...one more, with nearly all checked calls conflicting, is.
        hints.call_checked(4, true);
        assert_eq!(
            chained(&hints),
            [None, None, Some(0), None, Some(2), Some(4)]
        );
        assert_eq!(hints.conflicted().collect::<Vec<_>>(), [router]);
        // A plain transfer's failure teaches nothing.
        hints.call_checked(3, true);
        assert_eq!(hints.conflicted().count(), 1);

        // Conflicts in fewer than one in `CHAIN_ONE_IN` checked calls leave them unordered.
        let hints = build(
            &txs,
            Address::ZERO,
            true,
            Some(&LearnedConflicts::default()),
        );
        for _ in 0..CHAIN_MIN_CONFLICTS * CHAIN_ONE_IN + 1 - CHAIN_MIN_CONFLICTS {
            hints.call_checked(0, false);
        }
        for _ in 0..CHAIN_MIN_CONFLICTS {
            hints.call_checked(2, true);
        }
        assert!(chained(&hints).iter().all(Option::is_none));
        assert_eq!(hints.conflicted().count(), 0);
        // One more conflict reaches the share.
        hints.call_checked(5, true);
        assert_eq!(hints.conflicted().collect::<Vec<_>>(), [router]);

        // Learned: chained by the hints themselves, like every call without learning.
        let learned = LearnedConflicts::from_iter([router]);
        for learned in [Some(&learned), None] {
            let hints = build(&txs, Address::ZERO, true, learned);
            assert_eq!(hints.deps[2], [0]);
            assert_eq!(hints.deps[4], [2]);
            assert_eq!(hints.deps[5], [4]);
            assert_eq!(hints.calls[0], None);
            assert_eq!(hints.longest_chain, 4);
        }
    }

    /// Each `transferFrom` waits for the `approve` of the block that set its allowance (the
    /// allowance slot is the only key they share).
    fn assert_spends_wait_for_their_approvals(txs: &[Recovered<TxEnvelope>], hints: &BlockHints) {
        use overdrive_workload::erc20;
        let mut approvals = HashMap::<(Address, Address), TxIdx>::default();
        let mut spends = 0;
        for (i, tx) in txs.iter().enumerate() {
            if let Some((spender, _)) = erc20::decode_approve(tx.input()) {
                approvals.insert((tx.signer(), spender), i as TxIdx);
            } else if let Some((from, _, _)) = erc20::decode_transfer_from(tx.input())
                && let Some(&approval) = approvals.get(&(from, tx.signer()))
            {
                assert!(
                    hints.deps[i].contains(&approval),
                    "tx {i}: {:?}",
                    hints.deps[i]
                );
                spends += 1;
            }
        }
        assert!(
            spends >= 20,
            "only {spends} spends of this block's approvals"
        );
    }

    #[test]
    fn equal_to_the_definition_on_every_workload() {
        let empty = LearnedConflicts::default();
        for kind in WorkloadKind::ALL {
            for (seed, skew) in [(1, 0.0), (2, 0.5)] {
                let workload = generate(&WorkloadConfig {
                    kind,
                    accounts: 300,
                    txs_per_block: 400,
                    blocks: 1,
                    seed,
                    hot_share: 0.3,
                    sender_skew: skew,
                    pairs: 8,
                })
                .unwrap();
                let block = &workload.blocks[0];
                for lazy in [true, false] {
                    let coinbase = block.header.beneficiary;
                    let ours = build(&block.transactions, coinbase, lazy, None);
                    let expected = reference(&block.transactions, coinbase, lazy);
                    let what = format!("{kind} seed {seed} lazy {lazy}");
                    assert_eq!(ours.deps, expected.deps, "{what}");
                    assert_eq!(ours.lazy_recipient, expected.lazy_recipient, "{what}");
                    assert_eq!(ours.publish, expected.publish, "{what}");
                    assert_eq!(ours.longest_chain, expected.longest_chain, "{what}");
                    let mut many_slots = ours.many_slots.clone();
                    many_slots.sort_unstable();
                    assert_eq!(many_slots, expected.many_slots, "{what}");
                    if kind == WorkloadKind::Erc20 {
                        assert_eq!(many_slots.len(), 1, "{what}: the token");
                    }
                    if kind == WorkloadKind::Hybrid && lazy {
                        assert!(ours.lazy_recipient.iter().any(Option::is_some), "{what}");
                    }
                    if kind == WorkloadKind::Router {
                        // Undecoded: chained without learning; with it, unordered and
                        // reported to the committer's conflict count.
                        assert!(ours.longest_chain > 10, "{what}");
                        let learning = build(&block.transactions, coinbase, lazy, Some(&empty));
                        assert!(learning.calls.iter().all(Option::is_some), "{what}");
                    }
                    if kind == WorkloadKind::Allowance {
                        assert_spends_wait_for_their_approvals(&block.transactions, &ours);
                    }
                }
            }
        }
    }
}
