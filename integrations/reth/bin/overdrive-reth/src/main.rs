//! `overdrive-reth`: reth v2.5.1 (every subcommand and flag) with overdrive's components behind
//! `--overdrive.*` flags. With no flag it is stock reth.

use clap::{Parser, Subcommand};
use overdrive_reth_components::{
    OverdriveArgs, OverdriveNode, exex,
    import::ImportCommand,
    launch::MerkleStageLauncher,
    rpc::{self, BatchSubmit, OverdriveApiServer},
    split_args,
    stage_run::MerkleRunCommand,
    state_root,
};
use reth_ethereum::cli::{
    chainspec::EthereumChainSpecParser,
    interface::{Cli, Commands},
};
use reth_ethereum_cli::app::ExtendedCommand;
use reth_node_builder::DebugNodeLauncher;
use reth_rpc_server_types::DefaultRpcModuleValidator;
use std::ffi::OsString;

#[global_allocator]
static ALLOC: reth_cli_util::allocator::Allocator = reth_cli_util::allocator::new_allocator();

/// overdrive-reth's own subcommands, run in place of reth's when a component is on.
#[derive(Debug, Subcommand)]
enum OverdriveCommands {
    /// reth's `import`, with the database handed to overdrive's executor.
    #[command(name = "overdrive-import", hide = true)]
    Import(Box<ImportCommand>),
    /// reth's `stage run merkle`, with overdrive's merkle stage.
    #[command(name = "overdrive-stage-run", hide = true)]
    StageRun(Box<MerkleRunCommand>),
}

impl ExtendedCommand for OverdriveCommands {
    fn execute(self, runner: reth_cli_runner::CliRunner) -> eyre::Result<()> {
        match self {
            Self::Import(command) => command.run(runner),
            Self::StageRun(command) => command.run(runner),
        }
    }
}

/// reth logs an error for every block whose receipts were not streamed to its receipt-root
/// task while it executed: a whole-block executor hands them over at the end, and the receipt
/// root is then computed from the block's output instead. Not an error here.
const WHOLE_BLOCK_LOG_FILTER: &str = "engine::tree::payload_processor[receipt_root]=off,engine::tree::payload_validator[wait_receipt_root]=off";

fn main() {
    let code = match run() {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("Error: {error:?}");
            1
        }
    };
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let _ = std::io::Write::flush(&mut std::io::stderr());
    // Every database the command opened is closed by now, but RocksDB's background timer
    // thread can outlive it and abort the process while C++ static destructors run at exit
    // ("pthread lock: Invalid argument", facebook/rocksdb#11349): leave without running them.
    // SAFETY: `_exit` ends the process at once; no Rust code runs after it.
    unsafe { libc::_exit(code) }
}

/// Points the command line at overdrive's own command where reth's cannot take a component:
/// `import` needs the database opened before its EVM configuration is built, and its own
/// pipeline for the merkle stage; `stage run merkle` builds its stage inside reth's command.
fn rename_command(argv: &mut Vec<OsString>, args: &OverdriveArgs) {
    let Some(at) = argv
        .iter()
        .skip(1)
        .position(|a| !a.to_string_lossy().starts_with('-'))
        .map(|i| i + 1)
    else {
        return;
    };
    if args.import_on() && argv[at] == "import" {
        argv[at] = OsString::from("overdrive-import");
    } else if args.merkle_stage
        && argv[at] == "stage"
        && argv.get(at + 1).is_some_and(|a| a == "run")
        && argv[at + 2..].iter().any(|a| a == "merkle")
    {
        // `stage run` becomes one word; the stage's name stays where it was.
        argv[at] = OsString::from("overdrive-stage-run");
        argv.remove(at + 1);
    }
}

fn run() -> eyre::Result<()> {
    reth_cli_util::sigsegv_handler::install();
    if std::env::var_os("RUST_BACKTRACE").is_none() {
        // SAFETY: no other thread runs yet.
        unsafe { std::env::set_var("RUST_BACKTRACE", "1") };
    }

    let (mut argv, args) = match split_args(std::env::args_os()) {
        Ok(split) => split,
        Err(e) => e.exit(),
    };
    rename_command(&mut argv, &args);
    let mut cli = Cli::<
        EthereumChainSpecParser,
        OverdriveArgs,
        DefaultRpcModuleValidator,
        OverdriveCommands,
    >::parse_from(argv);
    match &mut cli.command {
        Commands::Ext(OverdriveCommands::Import(command)) => command.overdrive = args.clone(),
        Commands::Ext(OverdriveCommands::StageRun(command)) => command.overdrive = args.clone(),
        _ => {}
    }
    if args.exec_on() {
        for filter in [
            &mut cli.logs.log_stdout_filter,
            &mut cli.logs.log_file_filter,
        ] {
            if !filter.is_empty() {
                filter.push(',');
            }
            filter.push_str(WHOLE_BLOCK_LOG_FILTER);
        }
    }

    let offline = args.clone();
    cli.run_with_components::<OverdriveNode>(
        move |spec| {
            if offline.exec_on() {
                tracing::warn!(
                    target: "overdrive",
                    "this command runs reth's executor: {} applies to `node` and `import` only",
                    offline.summary()
                );
            }
            if offline.merkle_stage {
                tracing::warn!(
                    target: "overdrive",
                    "this command runs reth's merkle stage: --overdrive.merkle-stage applies to `node`, `import` and `stage run merkle` only"
                );
            }
            if offline.state_root_config().is_some() {
                tracing::warn!(
                    target: "overdrive",
                    "this command has no engine: --overdrive.state-root applies to `node` only"
                );
            }
            OverdriveNode::cli_components(spec)
        },
        async move |builder, _| {
            tracing::info!(target: "overdrive", "overdrive components: {}", args.summary());
            exex::describe_metrics();
            rpc::describe_metrics();
            state_root::describe_metrics();
            let node = OverdriveNode::new(args.clone());
            let log = node.block_log().clone();
            let intake = node.intake().cloned();
            let limits = args.pool_limits();
            let builder = builder
                .node(node)
                .install_exex_if(args.exec_on(), "overdrive-timings", async move |ctx| {
                    Ok(exex::timings_exex(ctx, log))
                })
                .extend_rpc_modules(move |ctx| {
                    let Some(intake) = intake else {
                        return Ok(());
                    };
                    if let Some(forwarder) = &ctx.config().rpc.rpc_forwarder {
                        tracing::warn!(
                            target: "overdrive",
                            %forwarder,
                            "overdrive_sendRawTransactions is not served: it inserts into the local pool only, and --rpc.forwarder forwards"
                        );
                        return Ok(());
                    }
                    let api = BatchSubmit::new(ctx.pool().clone(), intake, limits);
                    ctx.modules.merge_configured(api.into_rpc())?;
                    tracing::info!(target: "overdrive", "serving overdrive_sendRawTransactions");
                    Ok(())
                })
                ;
            let handle = if args.merkle_stage {
                // reth's launcher has no hook for a pipeline stage: this one is reth's with
                // the merkle stage set into its pipeline.
                let launcher = MerkleStageLauncher::new(
                    builder.task_executor().clone(),
                    builder.config().datadir(),
                    builder.config().tree_config(),
                    args.merkle_config(),
                );
                builder.launch_with(DebugNodeLauncher::new(launcher)).await?
            } else {
                builder.launch_with_debug_capabilities().await?
            };
            handle.wait_for_node_exit().await
        },
    )
}
