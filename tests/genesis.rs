//! Genesis roots of the dev preset and of a genesis.json, checked against independent sources.

use overdrive_primitives::{ChainParams, MemState};

#[test]
fn ethereum_tests_genesis_roots_match() {
    // Every fixture's genesis header commits to its pre-state; the runner checks that root
    // first, so passing fixtures prove the reference root on hundreds of genesis states.
    let dir = overdrive_tests::fixtures_dir().join("BlockchainTests/ValidBlocks/bcExample");
    let results = overdrive_ef_tests::run_paths(&[dir], Default::default()).unwrap();
    assert!(!results.results.is_empty());
    assert_eq!(results.counts().1, 0, "{:?}", results.results);
}

#[test]
fn dev_genesis_is_deterministic_and_funded() {
    let a = ChainParams::dev();
    let b = ChainParams::dev();
    let state = MemState::from_alloc(&a.genesis.alloc);
    let root = overdrive_trie::reference::state_root(&state);
    assert_eq!(
        root,
        overdrive_trie::reference::state_root(&MemState::from_alloc(&b.genesis.alloc))
    );
    assert_ne!(root, alloy_primitives::B256::ZERO);
    let header = a.genesis_header(root);
    assert_eq!(header.state_root, root);
    assert!(header.requests_hash.is_some() && header.parent_beacon_block_root.is_some());
    for i in 0..overdrive_primitives::DEV_ACCOUNT_COUNT {
        let account = &state.accounts[&overdrive_primitives::dev_address(i)];
        assert!(!account.info.balance.is_zero());
    }
}

#[test]
fn genesis_json_round_trips_through_init_rules() {
    let json = r#"{
        "config": {"chainId": 7, "homesteadBlock": 0, "eip150Block": 0, "eip155Block": 0,
                   "eip158Block": 0, "byzantiumBlock": 0, "constantinopleBlock": 0,
                   "petersburgBlock": 0, "istanbulBlock": 0, "berlinBlock": 0, "londonBlock": 0,
                   "terminalTotalDifficulty": 0, "shanghaiTime": 0, "cancunTime": 100},
        "gasLimit": "0x1c9c380", "difficulty": "0x0", "baseFeePerGas": "0x7",
        "alloc": {"0x1000000000000000000000000000000000000001": {"balance": "0x10"}}
    }"#;
    let dir = std::env::temp_dir().join(format!("overdrive-genesis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("genesis.json");
    std::fs::write(&path, json).unwrap();
    let spec = ChainParams::load(path.to_str().unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    use overdrive_primitives::EthereumHardforks;
    assert_eq!(spec.chain_id, 7);
    assert!(spec.is_shanghai_active_at_timestamp(0));
    assert!(!spec.is_cancun_active_at_timestamp(99) && spec.is_cancun_active_at_timestamp(100));
    let header = spec.genesis_header(alloy_primitives::B256::ZERO);
    assert_eq!(header.base_fee_per_gas, Some(7));
    assert!(header.withdrawals_root.is_some());
    assert!(
        header.blob_gas_used.is_none(),
        "Cancun is not active at genesis"
    );
    assert!(ChainParams::load("no-such-chain").is_err());
}

#[test]
fn mainnet_genesis_hash_and_root_match_the_known_values() {
    let alloc = std::env::var_os("OVERDRIVE_ARTIFACTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../build-artifacts").into())
        .join("mainnet-alloc.json");
    assert!(
        alloc.exists(),
        "{} missing: run scripts/setup.sh",
        alloc.display()
    );
    let spec = ChainParams::mainnet_with_alloc_file(&alloc).unwrap();
    let root = overdrive_trie::reference::state_root(&MemState::from_alloc(&spec.genesis.alloc));
    assert_eq!(
        root,
        alloy_primitives::b256!("d7f8974fb5ac78d9ac099b9ad5018bedc2ce0a72dad1827a1709da30580f0544")
    );
    assert_eq!(
        Some(spec.genesis_header(root).hash_slow()),
        spec.expected_genesis_hash
    );
}

/// The overdrive trie's root of a full state, built from empty.
fn overdrive_root(state: &MemState) -> alloy_primitives::B256 {
    use overdrive_trie::{HashedStateChanges, MemNodeStore, StateTrie, TrieConfig};
    let mut trie = StateTrie::new(MemNodeStore::default(), TrieConfig::with_threads(2)).unwrap();
    trie.apply(&HashedStateChanges::from_state(state))
        .unwrap()
        .root
}

#[test]
fn dev_and_generated_genesis_roots_match_the_reference() {
    let dev = MemState::from_alloc(&ChainParams::dev().genesis.alloc);
    assert_eq!(
        overdrive_root(&dev),
        overdrive_trie::reference::state_root(&dev)
    );

    use overdrive_workload::{WorkloadConfig, WorkloadKind, generate};
    for kind in [WorkloadKind::Erc20, WorkloadKind::Uniswap] {
        let w = generate(&WorkloadConfig {
            accounts: 500,
            pairs: 8,
            ..WorkloadConfig::new(kind)
        })
        .unwrap();
        let reference = overdrive_trie::reference::state_root(&w.genesis);
        assert_eq!(w.genesis_header.state_root, reference, "{kind}");
        assert_eq!(overdrive_root(&w.genesis), reference, "{kind}");
        // The chain spec's allocation is the same state.
        let from_alloc = MemState::from_alloc(&w.chain_spec.genesis.alloc);
        assert_eq!(
            overdrive_trie::reference::state_root(&from_alloc),
            reference,
            "{kind}"
        );
    }
}

#[test]
fn unusable_genesis_files_are_refused_with_their_reason() {
    use overdrive_primitives::ChainParamsError;
    let dir = std::env::temp_dir().join(format!("overdrive-bad-genesis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let load = |name: &str, json: &str| {
        let path = dir.join(name);
        std::fs::write(&path, json).unwrap();
        ChainParams::load(path.to_str().unwrap())
    };
    let invalid = |result: Result<ChainParams, ChainParamsError>, needle: &str| match result {
        Err(e @ ChainParamsError::Invalid { .. }) => {
            assert!(e.to_string().contains(needle), "{e}")
        }
        other => panic!("expected Invalid mentioning {needle}, got {other:?}"),
    };
    // alloy's `Genesis` defaults every missing field: `{}` would load as chain 1.
    invalid(load("empty.json", "{}"), "chainId");
    invalid(
        load("no-gas.json", r#"{"config": {"chainId": 7}}"#),
        "gasLimit",
    );
    invalid(
        load(
            "zero-gas.json",
            r#"{"config": {"chainId": 7}, "gasLimit": "0x0"}"#,
        ),
        "gasLimit",
    );
    invalid(
        load(
            "fee.json",
            r#"{"config": {"chainId": 7, "londonBlock": 0}, "gasLimit": "0x1c9c380",
                "baseFeePerGas": "0x10000000000000000"}"#,
        ),
        "baseFeePerGas",
    );
    assert!(matches!(
        load("junk.json", "not json"),
        Err(ChainParamsError::Json { .. })
    ));
    // A path that does not exist gets the file's error, with the path, not "unknown chain".
    let missing = dir.join("typo/genesis.json");
    match ChainParams::load(missing.to_str().unwrap()) {
        Err(e @ ChainParamsError::Io { .. }) => {
            assert!(e.to_string().contains("typo/genesis.json"), "{e}")
        }
        other => panic!("expected Io, got {other:?}"),
    }
    std::fs::remove_dir_all(&dir).ok();
}
