//! The node type: reth's `EthereumNode` with overdrive's executor builder, so that `node` and
//! the offline commands get the same EVM configuration.

use crate::{
    BlockLog, OverdriveArgs, OverdriveEvmConfig, ParallelBlocks, ProviderOpener,
    args::ExecMode,
    pool::{IntakeShared, OverdrivePoolBuilder},
    state_root::OverdriveEngineValidatorBuilder,
};
use overdrive_intake::{Intake, IntakeConfig};
use reth_chainspec::ChainSpec;
use reth_ethereum_consensus::EthBeaconConsensus;
use reth_ethereum_primitives::EthPrimitives;
use reth_evm_ethereum::{EthEvmConfig, factory::RethEvmFactory};
use reth_node_builder::{
    BuilderContext, DebugNode, FullNodeComponents, Node, NodeAdapter,
    components::{BasicPayloadServiceBuilder, ComponentsBuilder, ExecutorBuilder},
    node::{FullNodeTypes, NodeTypes},
    rpc::{BasicEngineApiBuilder, Identity, RpcAddOns},
};
use reth_node_ethereum::{
    EthEngineTypes, EthereumEthApiBuilder, EthereumNode,
    node::{
        EthereumAddOns, EthereumConsensusBuilder, EthereumEngineValidatorBuilder,
        EthereumExecutorBuilder, EthereumNetworkBuilder, EthereumPayloadBuilder,
    },
};
use reth_provider::EthStorage;
use std::sync::Arc;

/// reth's Ethereum node with overdrive's components, each on as its flag says.
#[derive(Debug, Clone, Default)]
pub struct OverdriveNode {
    args: OverdriveArgs,
    log: Arc<BlockLog>,
    intake: Option<Arc<IntakeShared>>,
}

impl OverdriveNode {
    /// A node with the components `args` switches on.
    pub fn new(args: OverdriveArgs) -> Self {
        let intake = args.pool.then(|| {
            let mut config = IntakeConfig::default();
            if let Some(threads) = args.pool_threads() {
                config.threads = threads;
            }
            Arc::new(IntakeShared::new(Intake::new(config)))
        });
        Self {
            args,
            log: Arc::default(),
            intake,
        }
    }

    /// What the pool and `overdrive_sendRawTransactions` share, when `--overdrive.pool`.
    pub fn intake(&self) -> Option<&Arc<IntakeShared>> {
        self.intake.as_ref()
    }

    /// The switches.
    pub fn args(&self) -> &OverdriveArgs {
        &self.args
    }

    /// Where the executor records each block it executes (read by the timings ExEx).
    pub fn block_log(&self) -> &Arc<BlockLog> {
        &self.log
    }

    /// The EVM configuration and consensus of the offline commands (`stage`, `re-execute`,
    /// `db`...). reth hands those commands' database to no component, so the parallel executor,
    /// which opens a read transaction per thread, cannot run there: they use reth's executor.
    /// `import` is run by overdrive-reth itself when a component is on (see `import`), with the
    /// database at hand.
    pub fn cli_components(
        spec: Arc<ChainSpec>,
    ) -> (OverdriveEvmConfig, Arc<EthBeaconConsensus<ChainSpec>>) {
        (
            OverdriveEvmConfig::new(
                EthEvmConfig::new_with_evm_factory(spec.clone(), RethEvmFactory::default()),
                None,
            ),
            Arc::new(EthBeaconConsensus::new(spec)),
        )
    }
}

impl NodeTypes for OverdriveNode {
    type Primitives = EthPrimitives;
    type ChainSpec = ChainSpec;
    type Storage = EthStorage;
    type Payload = EthEngineTypes;
}

impl<N> Node<N> for OverdriveNode
where
    N: FullNodeTypes<Types = Self>,
{
    type ComponentsBuilder = ComponentsBuilder<
        N,
        OverdrivePoolBuilder,
        BasicPayloadServiceBuilder<EthereumPayloadBuilder>,
        EthereumNetworkBuilder,
        OverdriveExecutorBuilder,
        EthereumConsensusBuilder,
    >;

    type AddOns = EthereumAddOns<
        NodeAdapter<N>,
        EthereumEthApiBuilder,
        EthereumEngineValidatorBuilder,
        BasicEngineApiBuilder<EthereumEngineValidatorBuilder>,
        OverdriveEngineValidatorBuilder,
    >;

    fn components_builder(&self) -> Self::ComponentsBuilder {
        EthereumNode::components()
            .pool(OverdrivePoolBuilder::new(self.intake.clone()))
            .executor(OverdriveExecutorBuilder {
                args: self.args.clone(),
                log: self.log.clone(),
            })
    }

    fn add_ons(&self) -> Self::AddOns {
        EthereumAddOns::new(RpcAddOns::new(
            EthereumEthApiBuilder::default(),
            EthereumEngineValidatorBuilder::default(),
            BasicEngineApiBuilder::default(),
            OverdriveEngineValidatorBuilder::new(self.args.state_root_config())
                .with_state_root_task(self.args.state_root_task),
            Default::default(),
            Identity::new(),
        ))
    }
}

impl<N: FullNodeComponents<Types = Self>> DebugNode<N> for OverdriveNode {
    type RpcBlock = alloy_rpc_types_eth::Block;

    fn rpc_to_primitive_block(rpc_block: Self::RpcBlock) -> reth_ethereum_primitives::Block {
        rpc_block.into_consensus().convert_transactions()
    }

    fn local_payload_attributes_builder(
        chain_spec: &Self::ChainSpec,
    ) -> impl reth_node_builder::PayloadAttributesBuilder<
        <Self::Payload as reth_node_builder::PayloadTypes>::PayloadAttributes,
    > {
        reth_engine_local::LocalPayloadAttributesBuilder::new(Arc::new(chain_spec.clone()))
    }
}

/// Builds the node's [`OverdriveEvmConfig`]: reth's (JIT and sender-recovery cache settings
/// included) with the parallel executor when `--overdrive.exec parallel`, reading through the
/// node's provider.
#[derive(Debug, Clone)]
pub struct OverdriveExecutorBuilder {
    args: OverdriveArgs,
    log: Arc<BlockLog>,
}

impl<N> ExecutorBuilder<N> for OverdriveExecutorBuilder
where
    N: FullNodeTypes<Types = OverdriveNode>,
{
    type EVM = OverdriveEvmConfig;

    async fn build_evm(self, ctx: &BuilderContext<N>) -> eyre::Result<Self::EVM> {
        let inner = EthereumExecutorBuilder::default().build_evm(ctx).await?;
        let parallel = (self.args.exec == ExecMode::Parallel).then(|| {
            Arc::new(ParallelBlocks::new(
                &ctx.chain_spec(),
                self.args.exec_threads(),
                Arc::new(ProviderOpener(ctx.provider().clone())),
                self.log,
            ))
        });
        Ok(OverdriveEvmConfig::new(inner, parallel))
    }
}
