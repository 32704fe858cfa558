//! Randomized blocks for differential tests: signed transactions of every type a fork allows,
//! against small hand-assembled contracts that exercise storage, value calls, CREATE/CREATE2
//! (with collisions), SELFDESTRUCT, transient storage, the coinbase balance, BLOCKHASH,
//! reverts, out-of-gas loops, every precompile of the fork (valid and invalid input), logs,
//! EIP-6110 deposits, contracts destroyed in their constructor and reads of what the block's
//! system calls wrote, an account sponsoring its own EIP-7702 authorization, with heavy
//! conflicts (hot senders, a hot recipient, a few shared contracts and slots).

#![allow(dead_code)]

use alloy_consensus::{
    Header, SignableTransaction, TxEip1559, TxEip2930, TxEip4844, TxEip4844Variant, TxEip7702,
    TxEnvelope, TxLegacy, transaction::Recovered,
};
use alloy_eips::{
    eip2930::{AccessList, AccessListItem},
    eip4895::Withdrawal,
    eip7002, eip7251,
    eip7702::Authorization,
};
use alloy_genesis::{ChainConfig, Genesis};
use alloy_primitives::{Address, B256, Bytes, Signature, TxKind, U256, keccak256, map::HashMap};
use overdrive_executor::{
    ExecuteBlock, ExecutionError, ParallelConfig, ParallelExecutor, Scheduling, SequentialExecutor,
    TransitionFolding,
};
use overdrive_primitives::{BlockWithSenders, ChainParams, MemState};
use rand::{Rng, SeedableRng, rngs::SmallRng, seq::IndexedRandom};
use revm::bytecode::Bytecode;
use secp256k1::{Message, SECP256K1, SecretKey};

/// A fork the generator targets (what tx types and opcodes exist).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fork {
    Homestead,
    Byzantium,
    London,
    Paris,
    Shanghai,
    Cancun,
    Prague,
    /// Osaka: the transaction gas cap, six blobs a transaction, the P-256 precompile, CLZ.
    Osaka,
    /// The first blob-parameter-only fork: Osaka's rules with BPO1's blob parameters.
    Bpo1,
}

impl Fork {
    pub const ALL: [Fork; 9] = [
        Fork::Homestead,
        Fork::Byzantium,
        Fork::London,
        Fork::Paris,
        Fork::Shanghai,
        Fork::Cancun,
        Fork::Prague,
        Fork::Osaka,
        Fork::Bpo1,
    ];

    pub fn spec(self) -> ChainParams {
        let at = |f: Fork| (self >= f).then_some(0u64);
        let config = ChainConfig {
            chain_id: 1337,
            homestead_block: Some(0),
            eip150_block: at(Fork::Byzantium),
            eip155_block: at(Fork::Byzantium),
            eip158_block: at(Fork::Byzantium),
            byzantium_block: at(Fork::Byzantium),
            constantinople_block: at(Fork::London),
            petersburg_block: at(Fork::London),
            istanbul_block: at(Fork::London),
            berlin_block: at(Fork::London),
            london_block: at(Fork::London),
            merge_netsplit_block: at(Fork::Paris),
            terminal_total_difficulty: (self >= Fork::Paris).then_some(U256::ZERO),
            terminal_total_difficulty_passed: self >= Fork::Paris,
            shanghai_time: at(Fork::Shanghai),
            cancun_time: at(Fork::Cancun),
            prague_time: at(Fork::Prague),
            osaka_time: at(Fork::Osaka),
            bpo1_time: at(Fork::Bpo1),
            deposit_contract_address: Some(DEPOSIT_CONTRACT),
            blob_schedule: (self >= Fork::Bpo1)
                .then(|| ("bpo1".to_string(), alloy_eips::eip7840::BlobParams::bpo1()))
                .into_iter()
                .collect(),
            ..Default::default()
        };
        ChainParams::from_genesis(Genesis {
            config,
            gas_limit: 60_000_000,
            ..Default::default()
        })
    }
}

/// Logs from this address are parsed as EIP-6110 deposits: its code ([`deposit_contract`])
/// emits one on every call, so Prague blocks carry deposit requests.
pub const DEPOSIT_CONTRACT: Address = Address::new([0xde; 20]);

/// Offset of the index field's bytes in [`deposit_event_data`].
pub const DEPOSIT_INDEX_AT: usize = 544;

/// The data of a well-formed EIP-6110 `DepositEvent`: five ABI-encoded byte strings of the
/// sizes the request parser requires (pubkey 48, withdrawal credentials 32, amount 8,
/// signature 96, index 8), 576 bytes.
pub fn deposit_event_data() -> Vec<u8> {
    let fields: [(usize, u8); 5] = [(48, 0x11), (32, 0x22), (8, 0x33), (96, 0x44), (8, 0)];
    let mut tail = Vec::new();
    let mut head = Vec::new();
    for (len, byte) in fields {
        head.extend_from_slice(&U256::from(32 * fields.len() + tail.len()).to_be_bytes::<32>());
        tail.extend_from_slice(&U256::from(len).to_be_bytes::<32>());
        tail.extend(std::iter::repeat_n(byte, len));
        tail.resize(tail.len().next_multiple_of(32), 0);
    }
    head.extend(tail);
    head
}

/// The deposit contract's code: every call, with value or without, emits one `DepositEvent`
/// whose index starts with the block number's low byte.
pub fn deposit_contract() -> Vec<u8> {
    let data = deposit_event_data();
    let topic = keccak256("DepositEvent(bytes,bytes,bytes,bytes,bytes)");
    let mut a = Asm::default();
    a.push(data.len() as u64)
        .push_label("event")
        .push(0)
        .op(CODECOPY);
    a.op(NUMBER).push(DEPOSIT_INDEX_AT as u64).op(MSTORE8);
    a.push32(topic.into())
        .push(data.len() as u64)
        .push(0)
        .op(LOG1)
        .op(STOP);
    a.data("event", &data);
    a.finish()
}

/// (precompile, input length) pairs of the kitchen sink's `precompiles` case, zero input:
/// valid for every one (points at infinity, zero scalars, empty exponents, zero rounds) except
/// the KZG point evaluation (0x0a), whose zero commitment does not match its versioned hash.
/// Before a precompile's fork its address is an empty account and the call just succeeds.
pub const PRECOMPILE_CALLS: [(u64, u64); 19] = [
    (0x01, 128),
    (0x02, 32),
    (0x03, 32),
    (0x04, 32),
    (0x05, 96),
    (0x06, 128),
    (0x07, 96),
    (0x08, 0),
    (0x08, 192),
    (0x09, 213),
    (0x0a, 192),
    (0x0b, 256),
    (0x0c, 160),
    (0x0d, 512),
    (0x0e, 288),
    (0x0f, 384),
    (0x10, 64),
    (0x11, 128),
    // P256VERIFY (EIP-7951, from Osaka; an empty account before).
    (0x100, 160),
];

/// A tiny assembler: opcodes, pushes and labelled jumps.
#[derive(Default)]
struct Asm {
    code: Vec<u8>,
    labels: HashMap<&'static str, usize>,
    fixups: Vec<(usize, &'static str)>,
}

const STOP: u8 = 0x00;
const ADD: u8 = 0x01;
const SUB: u8 = 0x03;
const MUL: u8 = 0x02;
const SHL: u8 = 0x1b;
const CLZ: u8 = 0x1e;
const DIV: u8 = 0x04;
const ISZERO: u8 = 0x15;
const AND: u8 = 0x16;
const EQ: u8 = 0x14;
const BALANCE: u8 = 0x31;
const CALLER: u8 = 0x33;
const CALLVALUE: u8 = 0x34;
const CALLDATALOAD: u8 = 0x35;
const CODECOPY: u8 = 0x39;
const BLOCKHASH: u8 = 0x40;
const COINBASE: u8 = 0x41;
const TIMESTAMP: u8 = 0x42;
const NUMBER: u8 = 0x43;
const SELFBALANCE: u8 = 0x47;
const POP: u8 = 0x50;
const MLOAD: u8 = 0x51;
const MSTORE: u8 = 0x52;
const SLOAD: u8 = 0x54;
const SSTORE: u8 = 0x55;
const JUMP: u8 = 0x56;
const JUMPI: u8 = 0x57;
const GAS: u8 = 0x5a;
const JUMPDEST: u8 = 0x5b;
const TLOAD: u8 = 0x5c;
const TSTORE: u8 = 0x5d;
const DUP1: u8 = 0x80;
const SWAP1: u8 = 0x90;
const LOG1: u8 = 0xa1;
const LOG2: u8 = 0xa2;
const MSTORE8: u8 = 0x53;
const CREATE: u8 = 0xf0;
const CALL: u8 = 0xf1;
const RETURN: u8 = 0xf3;
const CREATE2: u8 = 0xf5;
const STATICCALL: u8 = 0xfa;
const REVERT: u8 = 0xfd;
const SELFDESTRUCT: u8 = 0xff;

impl Asm {
    fn op(&mut self, op: u8) -> &mut Self {
        self.code.push(op);
        self
    }
    fn push(&mut self, value: u64) -> &mut Self {
        let bytes = value.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count().min(7);
        let data = &bytes[skip..];
        self.code.push(0x5f + data.len() as u8);
        self.code.extend_from_slice(data);
        self
    }
    fn push32(&mut self, value: U256) -> &mut Self {
        self.code.push(0x7f);
        self.code.extend_from_slice(&value.to_be_bytes::<32>());
        self
    }
    fn label(&mut self, name: &'static str) -> &mut Self {
        self.labels.insert(name, self.code.len());
        self.code.push(JUMPDEST);
        self
    }
    fn push_label(&mut self, name: &'static str) -> &mut Self {
        self.code.push(0x61);
        self.fixups.push((self.code.len(), name));
        self.code.extend_from_slice(&[0, 0]);
        self
    }
    /// Appends raw bytes at a label (for CODECOPY).
    fn data(&mut self, name: &'static str, bytes: &[u8]) -> &mut Self {
        self.labels.insert(name, self.code.len());
        self.code.extend_from_slice(bytes);
        self
    }
    /// Pushes calldata word `i` (at byte 1 + 32 i).
    fn arg(&mut self, i: u64) -> &mut Self {
        self.push(1 + 32 * i).op(CALLDATALOAD)
    }
    fn finish(mut self) -> Vec<u8> {
        for (at, name) in &self.fixups {
            let target = self.labels[name] as u16;
            self.code[*at..*at + 2].copy_from_slice(&target.to_be_bytes());
        }
        self.code
    }
}

/// Runtime of a CREATE/CREATE2 child: `SELFDESTRUCT(calldata word 0)`.
const CHILD_RUNTIME: [u8; 4] = [0x60, 0x00, 0x35, 0xff];

/// Init code of a child: stores 1 at slot 0, then, when created with value, self-destructs to
/// its creator (created and destroyed in one transaction: removed under Cancun's rules too),
/// otherwise returns [`CHILD_RUNTIME`]. One init code for both, so that the two share CREATE2
/// addresses: a block can destroy and re-create the same account.
pub fn child_initcode() -> Vec<u8> {
    let mut a = Asm::default();
    a.push(1).push(0).op(SSTORE);
    a.op(CALLVALUE)
        .op(ISZERO)
        .push_label("keep")
        .op(JUMPI)
        .op(CALLER)
        .op(SELFDESTRUCT);
    a.label("keep");
    a.push(u32::from_be_bytes(CHILD_RUNTIME) as u64)
        .push(0)
        .op(MSTORE);
    a.push(4).push(28).op(RETURN);
    a.finish()
}

/// Operations of the kitchen-sink contract (first calldata byte).
pub const OPS: u8 = 19;

/// The kitchen-sink contract: a dispatcher on calldata byte 0 (see `OPS`), arguments in the
/// 32-byte words after it. Uses DIV rather than SHR so pre-Constantinople forks can run the
/// dispatcher (the newer opcodes inside some cases then halt, which is also exercised).
pub fn kitchen_sink() -> Vec<u8> {
    let init = child_initcode();
    let mut a = Asm::default();
    a.push32(U256::from(1) << 248)
        .push(0)
        .op(CALLDATALOAD)
        .op(DIV);
    let cases: [&'static str; OPS as usize] = [
        "counter",
        "store",
        "call",
        "create",
        "create2",
        "destruct",
        "transient",
        "coinbase",
        "blockhash",
        "revert",
        "loop",
        "precompile",
        "log",
        "drain",
        "read",
        "ephemeral",
        "sysread",
        "precompiles",
        "clz",
    ];
    for (i, name) in cases.iter().enumerate() {
        a.op(DUP1).push(i as u64).op(EQ).push_label(name).op(JUMPI);
    }
    a.op(STOP);
    // 0: slots[arg0 & 3] += 1
    a.label("counter")
        .arg(0)
        .push(3)
        .op(AND)
        .op(DUP1)
        .op(SLOAD)
        .push(1)
        .op(ADD)
        .op(SWAP1)
        .op(SSTORE)
        .op(STOP);
    // 1: slots[arg0 & 7] = arg1
    a.label("store")
        .arg(1)
        .arg(0)
        .push(7)
        .op(AND)
        .op(SSTORE)
        .op(STOP);
    // 2: slots[8] = CALL(gas, arg0, arg1, 0, 0, 0, 0)
    a.label("call")
        .push(0)
        .push(0)
        .push(0)
        .push(0)
        .arg(1)
        .arg(0)
        .op(GAS)
        .op(CALL)
        .push(8)
        .op(SSTORE)
        .op(STOP);
    // 3: slots[9] = CREATE(0, child init code)
    a.label("create");
    a.push(init.len() as u64)
        .push_label("initcode")
        .push(0)
        .op(CODECOPY);
    a.push(init.len() as u64)
        .push(0)
        .push(0)
        .op(CREATE)
        .push(9)
        .op(SSTORE)
        .op(STOP);
    // 4: slots[10] = CREATE2(0, child init code, salt arg0)
    a.label("create2");
    create2_child(&mut a, init.len(), 0, 10);
    // 5: SELFDESTRUCT(arg0)
    a.label("destruct").arg(0).op(SELFDESTRUCT);
    // 6: slots[5] = tload(0) + tload(1) + tload(0) after tstore(0, arg0) and tstore(1, arg0).
    // The first two loads come before any store: a transaction starts with empty transient
    // storage, so they read 0 unless an earlier transaction's values leaked into this one
    // (a speculative worker reuses one EVM across transactions).
    a.label("transient")
        .push(0)
        .op(TLOAD)
        .push(1)
        .op(TLOAD)
        .op(ADD)
        .arg(0)
        .push(0)
        .op(TSTORE)
        .arg(0)
        .push(1)
        .op(TSTORE)
        .push(0)
        .op(TLOAD)
        .op(ADD)
        .push(5)
        .op(SSTORE)
        .op(STOP);
    // 7: slots[6] = BALANCE(COINBASE)
    a.label("coinbase")
        .op(COINBASE)
        .op(BALANCE)
        .push(6)
        .op(SSTORE)
        .op(STOP);
    // 8: slots[7] = BLOCKHASH(NUMBER - 1 - (arg0 & 3))
    a.label("blockhash")
        .arg(0)
        .push(3)
        .op(AND)
        .push(1)
        .op(NUMBER)
        .op(SUB)
        .op(SUB)
        .op(BLOCKHASH)
        .push(7)
        .op(SSTORE)
        .op(STOP);
    // 9: slots[0] = 1; REVERT
    a.label("revert")
        .push(1)
        .push(0)
        .op(SSTORE)
        .push(0)
        .push(0)
        .op(REVERT);
    // 10: loop until out of gas, after a write
    a.label("loop")
        .push(2)
        .push(1)
        .op(SSTORE)
        .label("spin")
        .push_label("spin")
        .op(JUMP);
    // 11: slots[11] = sha256(arg0) via STATICCALL to precompile 2
    a.label("precompile")
        .arg(0)
        .push(0)
        .op(MSTORE)
        .push(32)
        .push(0)
        .push(32)
        .push(0)
        .push(2)
        .op(GAS)
        .op(STATICCALL)
        .op(POP)
        .push(0)
        .op(MLOAD)
        .push(11)
        .op(SSTORE)
        .op(STOP);
    // 12: LOG2(mem[0..32] = arg0, topics arg1, CALLER)
    a.label("log")
        .arg(0)
        .push(0)
        .op(MSTORE)
        .op(CALLER)
        .arg(1)
        .push(32)
        .push(0)
        .op(LOG2)
        .op(STOP);
    // 13: CALL(gas, arg0, SELFBALANCE) — send everything
    a.label("drain")
        .push(0)
        .push(0)
        .push(0)
        .push(0)
        .op(SELFBALANCE)
        .arg(0)
        .op(GAS)
        .op(CALL)
        .op(POP)
        .op(STOP);
    // 14: slots[12] = slots[arg0 & 3] + BALANCE(arg1)
    a.label("read")
        .arg(1)
        .op(BALANCE)
        .arg(0)
        .push(3)
        .op(AND)
        .op(SLOAD)
        .op(ADD)
        .push(12)
        .op(SSTORE)
        .op(STOP);
    // 15: slots[13] = CREATE2(1 wei, child init code, salt arg0): a child that destroys
    // itself in its constructor, at the address op 4 creates a lasting child
    a.label("ephemeral");
    create2_child(&mut a, init.len(), 1, 13);
    // 16: reads what this block's system calls wrote: the EIP-4788 beacon root of this block's
    // timestamp (arg0 even) or the EIP-2935 hash of the parent block (arg0 odd);
    // slots[14] = success, slots[15] = the returned word
    let beacon = U256::from_be_slice(alloy_eips::eip4788::BEACON_ROOTS_ADDRESS.as_slice());
    let history = U256::from_be_slice(alloy_eips::eip2935::HISTORY_STORAGE_ADDRESS.as_slice());
    a.label("sysread")
        .arg(0)
        .push(1)
        .op(AND)
        .push_label("history")
        .op(JUMPI);
    a.op(TIMESTAMP).push(0).op(MSTORE);
    a.push(32).push(0).push(32).push(0).push32(beacon);
    a.push_label("sysread_done").op(JUMP);
    a.label("history")
        .push(1)
        .op(NUMBER)
        .op(SUB)
        .push(0)
        .op(MSTORE);
    a.push(32).push(0).push(32).push(0).push32(history);
    a.label("sysread_done")
        .op(GAS)
        .op(STATICCALL)
        .push(14)
        .op(SSTORE)
        .push(0)
        .op(MLOAD)
        .push(15)
        .op(SSTORE)
        .op(STOP);
    // 17: STATICCALL(200,000 gas, precompile arg0, arg1 zero bytes); slots[16] = success,
    // slots[17] = the first word returned
    a.label("precompiles")
        .push(32)
        .push(0x400)
        .arg(1)
        .push(0)
        .arg(0)
        .push(200_000)
        .op(STATICCALL)
        .push(16)
        .op(SSTORE)
        .push(0x400)
        .op(MLOAD)
        .push(17)
        .op(SSTORE)
        .op(STOP);
    // 18: slots[18] = CLZ(arg1 << (arg0 * 8)) (EIP-7939, Osaka; halts before)
    a.label("clz")
        .arg(1)
        .push(8)
        .arg(0)
        .op(MUL)
        .op(SHL)
        .op(CLZ)
        .push(18)
        .op(SSTORE)
        .op(STOP);
    a.data("initcode", &init);
    a.finish()
}

/// `slots[slot] = CREATE2(value, child init code, salt arg0)`, then STOP.
fn create2_child(a: &mut Asm, init_len: usize, value: u64, slot: u64) {
    a.push(init_len as u64)
        .push_label("initcode")
        .push(0)
        .op(CODECOPY);
    a.arg(0)
        .push(init_len as u64)
        .push(0)
        .push(value)
        .op(CREATE2)
        .push(slot)
        .op(SSTORE)
        .op(STOP);
}

/// An account with a key.
#[derive(Clone)]
pub struct Key {
    pub secret: SecretKey,
    pub address: Address,
}

impl Key {
    pub fn new(seed: u64, i: u64) -> Self {
        let mut k = keccak256([seed.to_be_bytes(), i.to_be_bytes()].concat());
        loop {
            if let Ok(secret) = SecretKey::from_slice(k.as_slice()) {
                let public = secp256k1::PublicKey::from_secret_key(SECP256K1, &secret);
                let address = Address::from_raw_public_key(&public.serialize_uncompressed()[1..]);
                return Self { secret, address };
            }
            k = keccak256(k);
        }
    }

    pub fn sign_hash(&self, hash: B256) -> Signature {
        let sig = SECP256K1.sign_ecdsa_recoverable(&Message::from_digest(hash.0), &self.secret);
        let (id, bytes) = sig.serialize_compact();
        Signature::new(
            U256::from_be_slice(&bytes[..32]),
            U256::from_be_slice(&bytes[32..]),
            i32::from(id) != 0,
        )
    }

    pub fn sign<T: SignableTransaction<Signature>>(&self, tx: T) -> Recovered<TxEnvelope>
    where
        TxEnvelope: From<alloy_consensus::Signed<T>>,
    {
        let sig = self.sign_hash(tx.signature_hash());
        Recovered::new_unchecked(TxEnvelope::from(tx.into_signed(sig)), self.address)
    }
}

/// Generator of random blocks over one evolving state.
pub struct Gen {
    pub rng: SmallRng,
    pub fork: Fork,
    pub spec: ChainParams,
    pub senders: Vec<Key>,
    pub authorities: Vec<Key>,
    /// An account that, from Prague, sends its own transactions with its own EIP-7702
    /// authorization in them (and plain ones). Never in another transaction's authorization
    /// list, so the generator knows its nonce.
    pub sponsor: Key,
    pub contracts: Vec<Address>,
    pub hot: Address,
    pub ghost: Address,
    /// Extra addresses that may or may not exist (fresh recipients, children).
    pub others: Vec<Address>,
    pub number: u64,
    pub timestamp: u64,
}

pub const CHAIN_ID: u64 = 1337;

pub use overdrive_primitives::soak;

/// Where the randomized tests' seeds start: `OVERDRIVE_SOAK_SEED`, else 0 (what CI runs).
/// A soak started from a new base explores chains no earlier run has, and a failure it finds
/// names its seed, so it replays with the same base.
///
/// # Panics
/// When the variable is set to something other than a number: a typo must not silently
/// rerun the default seeds.
pub fn seed_base() -> u64 {
    match std::env::var("OVERDRIVE_SOAK_SEED") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("OVERDRIVE_SOAK_SEED={v:?} is not a number")),
        Err(_) => 0,
    }
}

impl Gen {
    /// A generator and its genesis state.
    pub fn new(fork: Fork, seed: u64) -> (Self, MemState) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let spec = fork.spec();
        let senders: Vec<Key> = (0..24).map(|i| Key::new(seed, i)).collect();
        let authorities: Vec<Key> = (100..104).map(|i| Key::new(seed, i)).collect();
        let sponsor = Key::new(seed, 200);
        let mut state = MemState::default();
        let funds = U256::from(10u128.pow(24));
        for k in senders.iter().chain(&authorities).chain([&sponsor]) {
            state.insert_account(k.address, funds, 0, None, HashMap::default());
        }
        let sink = Bytecode::new_raw(Bytes::from(kitchen_sink()));
        let contracts: Vec<Address> = (0..4).map(|i| Address::new([0xc0 + i as u8; 20])).collect();
        for (i, c) in contracts.iter().enumerate() {
            let storage: HashMap<U256, U256> = (0..4)
                .map(|s| (U256::from(s), U256::from(10 + s + i as u64)))
                .collect();
            let balance = U256::from(rng.random_range(0..3u64) * 1_000_000_000);
            state.insert_account(*c, balance, 1, Some(sink.clone()), storage);
        }
        // An empty account that still has storage: touching it removes it (EIP-161).
        let ghost = Address::new([0x60; 20]);
        state.insert_account(
            ghost,
            U256::ZERO,
            0,
            None,
            [(U256::from(1), U256::from(5))].into_iter().collect(),
        );
        let hot = Address::new([0x40; 20]);
        state.insert_account(hot, U256::from(1), 0, None, HashMap::default());
        state.insert_account(
            DEPOSIT_CONTRACT,
            U256::ZERO,
            1,
            Some(Bytecode::new_raw(deposit_contract().into())),
            HashMap::default(),
        );
        if fork >= Fork::Cancun {
            for (address, code) in [
                (
                    alloy_eips::eip4788::BEACON_ROOTS_ADDRESS,
                    alloy_eips::eip4788::BEACON_ROOTS_CODE.clone(),
                ),
                (
                    alloy_eips::eip2935::HISTORY_STORAGE_ADDRESS,
                    alloy_eips::eip2935::HISTORY_STORAGE_CODE.clone(),
                ),
                (
                    eip7002::WITHDRAWAL_REQUEST_PREDEPLOY_ADDRESS,
                    eip7002::WITHDRAWAL_REQUEST_PREDEPLOY_CODE.clone(),
                ),
                (
                    eip7251::CONSOLIDATION_REQUEST_PREDEPLOY_ADDRESS,
                    eip7251::CONSOLIDATION_REQUEST_PREDEPLOY_CODE.clone(),
                ),
            ] {
                state.insert_account(
                    address,
                    U256::ZERO,
                    1,
                    Some(Bytecode::new_raw(code)),
                    HashMap::default(),
                );
            }
        }
        let init_hash = keccak256(child_initcode());
        let mut others: Vec<Address> = (0..6).map(|i| Address::new([0x70 + i as u8; 20])).collect();
        for c in &contracts {
            for salt in 0..3u64 {
                others.push(c.create2(B256::from(U256::from(salt)), init_hash));
            }
            for nonce in 1..4 {
                others.push(c.create(nonce));
            }
        }
        for n in 0..8u64 {
            state.block_hashes.insert(n, keccak256(n.to_be_bytes()));
        }
        let generator = Self {
            rng,
            fork,
            spec,
            senders,
            authorities,
            sponsor,
            contracts,
            hot,
            ghost,
            others,
            number: 8,
            timestamp: 1_000,
        };
        (generator, state)
    }

    fn any_address(&mut self) -> Address {
        match self.rng.random_range(0..7) {
            0 => self.senders.choose(&mut self.rng).unwrap().address,
            1 => *self.contracts.choose(&mut self.rng).unwrap(),
            2 => self.hot,
            3 => self.ghost,
            4 => self.authorities.choose(&mut self.rng).unwrap().address,
            5 => DEPOSIT_CONTRACT,
            _ => *self.others.choose(&mut self.rng).unwrap(),
        }
    }

    fn word(&mut self, v: U256) -> [u8; 32] {
        v.to_be_bytes::<32>()
    }

    fn call_data(&mut self, coinbase: Address) -> (Bytes, u64) {
        let op = self.rng.random_range(0..OPS);
        let mut data = vec![op];
        let arg0 = match op {
            2 | 5 | 13 => {
                if self.rng.random_bool(0.2) {
                    U256::from_be_slice(coinbase.as_slice())
                } else {
                    let a = self.any_address();
                    U256::from_be_slice(a.as_slice())
                }
            }
            4 | 15 => U256::from(self.rng.random_range(0..3u64)),
            _ => U256::from(self.rng.random_range(0..6u64)),
        };
        let arg1 = match op {
            14 => {
                let a = self.any_address();
                U256::from_be_slice(a.as_slice())
            }
            _ => U256::from(self.rng.random_range(0..1000u64)),
        };
        let (arg0, arg1) = match op {
            17 => {
                let (address, len) = *PRECOMPILE_CALLS.choose(&mut self.rng).unwrap();
                (U256::from(address), U256::from(len))
            }
            _ => (arg0, arg1),
        };
        data.extend_from_slice(&self.word(arg0));
        data.extend_from_slice(&self.word(arg1));
        let gas = match op {
            10 => 120_000,
            17 => 400_000,
            _ => 250_000,
        };
        (data.into(), gas)
    }

    /// Runs `blocks` random blocks of `txs` transactions through the sequential executor,
    /// applying each to `state`: a chain's history before the block a test looks at.
    pub fn advance(&mut self, state: &mut MemState, blocks: usize, txs: usize) {
        for _ in 0..blocks {
            let block = self.block(state, txs);
            let out = SequentialExecutor
                .execute(&self.spec, &block, state)
                .expect("valid");
            state.apply_bundle(&out.bundle);
            state.block_hashes.insert(block.number(), block.hash);
        }
    }

    /// A random block of `txs` transactions on top of `state`.
    pub fn block(&mut self, state: &MemState, txs: usize) -> BlockWithSenders {
        self.number += 1;
        self.timestamp += 12;
        let fork = self.fork;
        let coinbase = match self.rng.random_range(0..5) {
            0 => self.senders[0].address,
            1 => self.contracts[0],
            2 => self.hot,
            3 => Address::new([0xcb; 20]),
            _ => self.others[self.rng.random_range(0..self.others.len())],
        };
        let base_fee = (fork >= Fork::London).then(|| self.rng.random_range(1..2_000u64));
        let mut nonces: HashMap<Address, u64> = HashMap::default();
        let mut transactions = Vec::with_capacity(txs);
        let hot_senders = 3;
        for _ in 0..txs {
            if fork >= Fork::Prague && self.rng.random_bool(0.08) {
                let key = self.sponsor.clone();
                let nonce = *nonces.entry(key.address).or_insert_with(|| {
                    state.accounts.get(&key.address).map_or(0, |a| a.info.nonce)
                });
                let (tx, used) = if self.rng.random_bool(0.5) {
                    (self.self_sponsored(&key, nonce, base_fee, coinbase), 2)
                } else {
                    (self.tx(&key, nonce, base_fee, coinbase), 1)
                };
                nonces.insert(key.address, nonce + used);
                transactions.push(tx);
                continue;
            }
            let key = if self.rng.random_bool(0.4) {
                self.senders[self.rng.random_range(0..hot_senders)].clone()
            } else {
                self.senders.choose(&mut self.rng).unwrap().clone()
            };
            let nonce = *nonces
                .entry(key.address)
                .or_insert_with(|| state.accounts.get(&key.address).map_or(0, |a| a.info.nonce));
            nonces.insert(key.address, nonce + 1);
            let tx = self.tx(&key, nonce, base_fee, coinbase);
            transactions.push(tx);
        }
        let withdrawals = (fork >= Fork::Shanghai).then(|| {
            (0..self.rng.random_range(0..4u64))
                .map(|i| Withdrawal {
                    index: self.number * 10 + i,
                    validator_index: i,
                    address: if i == 0 { coinbase } else { self.any_address() },
                    amount: self.rng.random_range(0..3u64),
                })
                .collect::<Vec<_>>()
        });
        let header = Header {
            parent_hash: B256::from(self.rng.random::<[u8; 32]>()),
            beneficiary: coinbase,
            number: self.number,
            gas_limit: 60_000_000,
            timestamp: self.timestamp,
            base_fee_per_gas: base_fee,
            difficulty: if fork >= Fork::Paris {
                U256::ZERO
            } else {
                U256::from(131_072)
            },
            mix_hash: B256::from(self.rng.random::<[u8; 32]>()),
            parent_beacon_block_root: (fork >= Fork::Cancun)
                .then(|| B256::from(self.rng.random::<[u8; 32]>())),
            // A blob base fee of 1 to 4 wei (a transaction offers 10): blob fees that are not
            // the minimum, on every blob transaction.
            excess_blob_gas: (fork >= Fork::Cancun).then(|| self.rng.random_range(0..5_000_000)),
            blob_gas_used: (fork >= Fork::Cancun).then_some(0),
            ..Default::default()
        };
        BlockWithSenders::from_parts(header, transactions, Vec::new(), withdrawals)
    }

    /// A type-4 transaction of `key` that carries its own authorization (nonce + 1: the
    /// sender's nonce is bumped before authorizations are applied) delegating to the
    /// kitchen sink, and calls itself with a kitchen-sink operation that keeps its balance.
    /// The sender's nonce goes up by two.
    fn self_sponsored(
        &mut self,
        key: &Key,
        nonce: u64,
        base_fee: Option<u64>,
        coinbase: Address,
    ) -> Recovered<TxEnvelope> {
        let auth = Authorization {
            chain_id: U256::from(CHAIN_ID),
            address: self.contracts[1],
            nonce: nonce + 1,
        };
        let sig = key.sign_hash(auth.signature_hash());
        // Not 5 (self-destruct) or 13 (drain): either would send the sender's whole balance
        // away and leave its next transaction unable to pay; not 3, 4 or 15 (a CREATE bumps
        // the sender's nonce, which the generator tracks); not 10 (spins out of gas).
        let (mut input, gas) = self.call_data(coinbase);
        if matches!(input[0], 3 | 4 | 5 | 10 | 13 | 15) {
            input = {
                let mut v = input.to_vec();
                v[0] = 0;
                v.into()
            };
        }
        let tip = 1;
        key.sign(TxEip7702 {
            chain_id: CHAIN_ID,
            nonce,
            gas_limit: gas + 50_000,
            max_fee_per_gas: base_fee.unwrap_or(0) as u128 * 2 + tip + 1,
            max_priority_fee_per_gas: tip,
            to: key.address,
            value: U256::ZERO,
            access_list: Default::default(),
            authorization_list: vec![auth.into_signed(sig)],
            input,
        })
    }

    fn tx(
        &mut self,
        key: &Key,
        nonce: u64,
        base_fee: Option<u64>,
        coinbase: Address,
    ) -> Recovered<TxEnvelope> {
        let fork = self.fork;
        let tip: u128 = if self.rng.random_bool(0.3) {
            0
        } else {
            self.rng.random_range(1..50)
        };
        let max_fee = base_fee.unwrap_or(0) as u128 * 2 + tip + 1;
        // What the transaction does.
        let (to, value, input, gas_limit): (TxKind, U256, Bytes, u64) =
            match self.rng.random_range(0..20) {
                0..=4 => {
                    let to = match self.rng.random_range(0..8) {
                        0 | 1 => self.hot,
                        2 => coinbase,
                        3 => self.ghost,
                        4 => self.senders.choose(&mut self.rng).unwrap().address,
                        // A precompile: code-less, so a plain transfer to it looks like one to
                        // a lazy recipient, which it must not become (its call runs code).
                        5 => Address::with_last_byte(self.rng.random_range(1..3)),
                        _ => self.any_address(),
                    };
                    let value = if self.rng.random_bool(0.15) {
                        U256::ZERO
                    } else {
                        U256::from(self.rng.random_range(1..1_000_000u64))
                    };
                    (TxKind::Call(to), value, Bytes::new(), 100_000)
                }
                5..=15 => {
                    let to = if self.rng.random_bool(0.15) {
                        // A child (maybe created, maybe destroyed) or a delegated authority.
                        if self.rng.random_bool(0.5) {
                            *self.others.choose(&mut self.rng).unwrap()
                        } else {
                            self.authorities.choose(&mut self.rng).unwrap().address
                        }
                    } else {
                        *self.contracts.choose(&mut self.rng).unwrap()
                    };
                    let (data, gas) = self.call_data(coinbase);
                    let value = if self.rng.random_bool(0.3) {
                        U256::from(self.rng.random_range(1..10_000u64))
                    } else {
                        U256::ZERO
                    };
                    (TxKind::Call(to), value, data, gas)
                }
                16 => (
                    TxKind::Create,
                    U256::from(self.rng.random_range(0..3u64)),
                    Bytes::from(child_initcode()),
                    200_000,
                ),
                17 if fork >= Fork::Prague => {
                    // An EIP-7002 withdrawal request (fee 1 wei at zero excess; more is refunded? no:
                    // the contract keeps it) or an EIP-7251 consolidation request.
                    if self.rng.random_bool(0.5) {
                        (
                            TxKind::Call(eip7002::WITHDRAWAL_REQUEST_PREDEPLOY_ADDRESS),
                            U256::from(2),
                            Bytes::from(vec![0x11u8; 56]),
                            200_000,
                        )
                    } else {
                        (
                            TxKind::Call(eip7251::CONSOLIDATION_REQUEST_PREDEPLOY_ADDRESS),
                            U256::from(2),
                            Bytes::from(vec![0x22u8; 96]),
                            200_000,
                        )
                    }
                }
                _ => {
                    let pc = Address::with_last_byte(self.rng.random_range(1..10));
                    (
                        TxKind::Call(pc),
                        U256::from(self.rng.random_range(0..2u64)),
                        Bytes::from(vec![7u8; 64]),
                        100_000,
                    )
                }
            };
        let access_list = if self.rng.random_bool(0.3) {
            let address = match to {
                TxKind::Call(a) => a,
                TxKind::Create => self.hot,
            };
            AccessList(vec![AccessListItem {
                address,
                storage_keys: (0..self.rng.random_range(0..3u64))
                    .map(|s| B256::from(U256::from(s)))
                    .collect(),
            }])
        } else {
            AccessList::default()
        };
        let mut kinds = vec![0u8];
        if fork >= Fork::London {
            kinds.extend([1, 2, 2, 2]);
        }
        if fork >= Fork::Cancun && matches!(to, TxKind::Call(_)) {
            kinds.push(3);
        }
        if fork >= Fork::Prague && matches!(to, TxKind::Call(_)) {
            kinds.push(4);
        }
        let gas_price = base_fee.unwrap_or(0) as u128 + tip + 1;
        match *kinds.choose(&mut self.rng).unwrap() {
            0 => key.sign(TxLegacy {
                chain_id: (fork >= Fork::Byzantium && self.rng.random_bool(0.5))
                    .then_some(CHAIN_ID),
                nonce,
                gas_price,
                gas_limit,
                to,
                value,
                input,
            }),
            1 => key.sign(TxEip2930 {
                chain_id: CHAIN_ID,
                nonce,
                gas_price,
                gas_limit,
                to,
                value,
                access_list,
                input,
            }),
            2 => key.sign(TxEip1559 {
                chain_id: CHAIN_ID,
                nonce,
                gas_limit,
                max_fee_per_gas: max_fee,
                max_priority_fee_per_gas: tip,
                to,
                value,
                access_list,
                input,
            }),
            3 => {
                let TxKind::Call(to) = to else { unreachable!() };
                // Up to the most a transaction may carry at this fork (six from Osaka).
                let most = self
                    .spec
                    .blob_params_at(self.timestamp)
                    .map_or(1, |p| p.max_blobs_per_tx);
                let blob_versioned_hashes = (0..self.rng.random_range(1..=most))
                    .map(|_| {
                        let mut hash = B256::from(self.rng.random::<[u8; 32]>());
                        hash.0[0] = 1;
                        hash
                    })
                    .collect();
                key.sign(TxEip4844Variant::<
                    alloy_eips::eip4844::BlobTransactionSidecar,
                >::TxEip4844(TxEip4844 {
                    chain_id: CHAIN_ID,
                    nonce,
                    gas_limit,
                    max_fee_per_gas: max_fee,
                    max_priority_fee_per_gas: tip,
                    to,
                    value,
                    access_list,
                    blob_versioned_hashes,
                    max_fee_per_blob_gas: 10,
                    input,
                }))
            }
            _ => {
                let TxKind::Call(to) = to else { unreachable!() };
                let authorization_list = (0..self.rng.random_range(1..3))
                    .map(|_| {
                        let authority = self.authorities.choose(&mut self.rng).unwrap().clone();
                        let auth = Authorization {
                            chain_id: U256::from(*[CHAIN_ID, 0, 7].choose(&mut self.rng).unwrap()),
                            address: if self.rng.random_bool(0.8) {
                                self.contracts[1]
                            } else {
                                Address::ZERO
                            },
                            nonce: self.rng.random_range(0..4),
                        };
                        let sig = authority.sign_hash(auth.signature_hash());
                        auth.into_signed(sig)
                    })
                    .collect();
                key.sign(TxEip7702 {
                    chain_id: CHAIN_ID,
                    nonce,
                    gas_limit,
                    max_fee_per_gas: max_fee,
                    max_priority_fee_per_gas: tip,
                    to,
                    value,
                    access_list,
                    authorization_list,
                    input,
                })
            }
        }
    }
}

/// Runs `block` through the sequential executor and through `parallel`; panics with context
/// when they differ. Returns the reference result.
pub fn assert_equal(
    parallel: &ParallelExecutor,
    spec: &ChainParams,
    block: &BlockWithSenders,
    state: &MemState,
    what: &str,
) -> Result<overdrive_executor::BlockOutput, ExecutionError> {
    let expected = SequentialExecutor.execute(spec, block, state);
    let actual = parallel.execute(spec, block, state);
    if actual != expected {
        match (&expected, &actual) {
            (Ok(e), Ok(a)) => {
                let first = e.receipts.iter().zip(&a.receipts).position(|(x, y)| x != y);
                panic!(
                    "{what}: parallel != sequential (first receipt difference at {first:?}; gas {} vs {}; \
                     receipts {} vs {}; requests equal {}; bundle equal {})\nexpected bundle: {:#?}\nactual bundle: {:#?}",
                    e.gas_used,
                    a.gas_used,
                    e.receipts.len(),
                    a.receipts.len(),
                    e.requests == a.requests,
                    e.bundle == a.bundle,
                    e.bundle.state,
                    a.bundle.state
                )
            }
            _ => panic!(
                "{what}: parallel {} != sequential {}",
                brief(&actual),
                brief(&expected)
            ),
        }
    }
    expected
}

/// An executor's result in a line: the error, or the output's size.
fn brief(result: &Result<overdrive_executor::BlockOutput, ExecutionError>) -> String {
    match result {
        Ok(out) => format!(
            "Ok({} receipts, gas {}, {} accounts changed)",
            out.receipts.len(),
            out.gas_used,
            out.bundle.state.len()
        ),
        Err(e) => format!("Err({e:?})"),
    }
}

/// A parallel executor that runs every block with a transaction in parallel, whatever its gas.
/// With 3 or 4 threads it also speculates blocks that are one long chain (which the default
/// hands to the committer alone), so that path stays tested, and folds the state transitions
/// on the pool (which 2 threads seldom choose); with 4 the committer never runs ahead of
/// speculation (`speculate_all`), so every transaction goes through validation and a test can
/// count on speculative results being committed whatever the timing.
pub fn parallel(threads: usize) -> ParallelExecutor {
    ParallelExecutor::new(test_config(threads))
}

/// [`parallel`]'s configuration.
pub fn test_config(threads: usize) -> ParallelConfig {
    ParallelConfig {
        threads,
        min_txs_for_parallel: 0,
        min_gas_for_parallel: 0,
        scheduling: Scheduling {
            chain_fallback: !matches!(threads, 3 | 4),
            speculate_all: threads == 4,
            transition_folding: if matches!(threads, 3 | 4) {
                TransitionFolding::Pool
            } else {
                TransitionFolding::Auto
            },
            ..Scheduling::default()
        },
    }
}

/// [`parallel`] with every optional shortcut off: the coinbase fee and transfers to hot
/// recipients paid eagerly, and no contract's calls ordered for having conflicted.
pub fn parallel_eager(threads: usize) -> ParallelExecutor {
    let config = test_config(threads);
    ParallelExecutor::new(ParallelConfig {
        scheduling: Scheduling {
            lazy_coinbase: false,
            lazy_recipients: false,
            learn_conflicts: false,
            ..config.scheduling
        },
        ..config
    })
}

/// A readable account of how two outputs differ.
pub fn describe_diff(
    e: &overdrive_executor::BlockOutput,
    a: &overdrive_executor::BlockOutput,
) -> String {
    let mut out = String::new();
    if e.gas_used != a.gas_used {
        out += &format!("gas {} vs {}\n", e.gas_used, a.gas_used);
    }
    for (i, (x, y)) in e.receipts.iter().zip(&a.receipts).enumerate() {
        if x != y {
            out += &format!("receipt {i}:\n  expected {x:?}\n  actual   {y:?}\n");
            break;
        }
    }
    for (addr, acc) in &e.bundle.state {
        match a.bundle.state.get(addr) {
            Some(b) if b == acc => {}
            other => out += &format!("account {addr}:\n  expected {acc:?}\n  actual   {other:?}\n"),
        }
    }
    for addr in a.bundle.state.keys() {
        if !e.bundle.state.contains_key(addr) {
            out += &format!("extra account {addr}: {:?}\n", a.bundle.state[addr]);
        }
    }
    if e.bundle.reverts != a.bundle.reverts {
        out += "reverts differ\n";
    }
    if e.bundle.contracts != a.bundle.contracts {
        let ek: std::collections::BTreeMap<_, _> = e
            .bundle
            .contracts
            .iter()
            .map(|(k, v)| (*k, v.original_bytes()))
            .collect();
        let ak: std::collections::BTreeMap<_, _> = a
            .bundle
            .contracts
            .iter()
            .map(|(k, v)| (*k, v.original_bytes()))
            .collect();
        out += &format!("contracts differ:\n  expected {ek:?}\n  actual   {ak:?}\n");
    }
    if (e.bundle.state_size, e.bundle.reverts_size) != (a.bundle.state_size, a.bundle.reverts_size)
    {
        out += &format!(
            "sizes {:?} vs {:?}\n",
            (e.bundle.state_size, e.bundle.reverts_size),
            (a.bundle.state_size, a.bundle.reverts_size)
        );
    }
    out
}
