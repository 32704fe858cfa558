// A node checked by viem, a client nobody here wrote: deploys the project's OpenZeppelin ERC20,
// sends ether and tokens, reads back receipts, logs, balances, storage, calls and gas estimates.
// Usage: node viem_check.mjs RPC_URL TOKEN_ARTIFACT
import { readFileSync } from "node:fs";
import {
  createPublicClient, createWalletClient, http, defineChain, encodeAbiParameters, keccak256,
  parseEventLogs, hexToBigInt,
} from "viem";
import { privateKeyToAccount, generatePrivateKey } from "viem/accounts";

// The first account of reth's --dev chain (the "test test ... junk" mnemonic).
const DEV_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";

function check(what, got, expected) {
  const g = typeof got === "bigint" ? got.toString() : JSON.stringify(got);
  const e = typeof expected === "bigint" ? expected.toString() : JSON.stringify(expected);
  if (g !== e) {
    console.error(`viem: ${what}: got ${g}, expected ${e}`);
    process.exit(1);
  }
  console.log(`viem: ${what}: ${g}`);
}

const [rpc, artifact] = process.argv.slice(2);
const { abi, bytecode } = JSON.parse(readFileSync(artifact, "utf8"));
const probe = createPublicClient({ transport: http(rpc) });
const chain = defineChain({
  id: await probe.getChainId(), name: "node", nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
  rpcUrls: { default: { http: [rpc] } },
});
const client = createPublicClient({ chain, transport: http(rpc) });
const account = privateKeyToAccount(DEV_KEY);
const wallet = createWalletClient({ account, chain, transport: http(rpc) });
console.log(`viem: chain ${chain.id}, head ${await client.getBlockNumber()}`);

async function mined(hash) {
  const receipt = await client.waitForTransactionReceipt({ hash, timeout: 60_000 });
  check(`receipt status of ${hash.slice(0, 10)}`, receipt.status, "success");
  return receipt;
}

const supply = 10n ** 24n;
const deployed = await mined(await wallet.deployContract({ abi, bytecode, args: ["Overdrive Check", "ODC", supply] }));
const token = deployed.contractAddress;
check("deployed code present", (await client.getCode({ address: token })).length > 2, true);
check("symbol()", await client.readContract({ address: token, abi, functionName: "symbol" }), "ODC");

const to = privateKeyToAccount(generatePrivateKey()).address;
const ether = await mined(await wallet.sendTransaction({ to, value: 4242n }));
check("ether transfer gas used", ether.gasUsed, 21000n);
check("recipient balance", await client.getBalance({ address: to }), 4242n);

const amount = 999n;
const estimate = await client.estimateContractGas({ address: token, abi, functionName: "transfer", args: [to, amount], account });
check("transfer estimate in range", estimate > 30000n && estimate < 80000n, true);
const sent = await mined(await wallet.writeContract({ address: token, abi, functionName: "transfer", args: [to, amount] }));
check("gas used within the estimate", sent.gasUsed <= estimate, true);
const logs = parseEventLogs({ abi, logs: sent.logs, eventName: "Transfer" });
check("Transfer logs", logs.length, 1);
check("Transfer args", [logs[0].args.from, logs[0].args.to, logs[0].args.value.toString()], [account.address, to, amount.toString()]);
check("balanceOf(recipient)", await client.readContract({ address: token, abi, functionName: "balanceOf", args: [to] }), amount);
const slot = keccak256(encodeAbiParameters([{ type: "address" }, { type: "uint256" }], [to, 0n]));
check("storage of the recipient's balance", hexToBigInt(await client.getStorageAt({ address: token, slot })), amount);
const got = await client.getLogs({ address: token, fromBlock: sent.blockNumber, toBlock: sent.blockNumber });
check("eth_getLogs", got.length, 1);
const block = await client.getBlock({ blockNumber: sent.blockNumber });
check("the block lists the transaction", block.transactions.includes(sent.transactionHash), true);
console.log("viem: all checks passed");
