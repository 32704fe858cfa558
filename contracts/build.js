// Compiles contracts/Token.sol with the pinned solc-js and gathers the published Uniswap V2
// artifacts, writing everything the workload generators load into one output directory.
//
// Usage: node contracts/build.js <output dir>
// Run through scripts/setup-contracts.sh, which installs the pinned packages first.
"use strict";

const fs = require("fs");
const path = require("path");
const solc = require("solc");

const here = __dirname;
const out = process.argv[2];
if (!out) {
  console.error("usage: node contracts/build.js <output dir>");
  process.exit(2);
}
fs.mkdirSync(out, { recursive: true });

const pkg = JSON.parse(fs.readFileSync(path.join(here, "package.json"), "utf8"));
const pinnedSolc = pkg.dependencies.solc;
// solc-js reports e.g. "0.8.30+commit.73712a01.Emscripten.clang"; a mismatch means
// node_modules is stale, and the bytecode would silently differ from the pinned one.
if (!solc.version().startsWith(pinnedSolc + "+")) {
  console.error(`solc-js is ${solc.version()}, package.json pins ${pinnedSolc}; rerun npm ci`);
  process.exit(1);
}

// Prague is the fork of ChainSpec::dev; solc >= 0.8.30 would otherwise pick its own default.
const EVM_VERSION = "prague";

function findImport(importPath) {
  const file = path.join(here, "node_modules", importPath);
  try {
    return { contents: fs.readFileSync(file, "utf8") };
  } catch (e) {
    return { error: `import ${importPath} not found in contracts/node_modules` };
  }
}

const input = {
  language: "Solidity",
  sources: { "Token.sol": { content: fs.readFileSync(path.join(here, "Token.sol"), "utf8") } },
  settings: {
    optimizer: { enabled: true, runs: 200 },
    evmVersion: EVM_VERSION,
    outputSelection: {
      "Token.sol": { Token: ["abi", "evm.bytecode.object", "evm.deployedBytecode.object", "storageLayout"] },
    },
  },
};

const output = JSON.parse(solc.compile(JSON.stringify(input), { import: findImport }));
const errors = (output.errors || []).filter((e) => e.severity === "error");
for (const e of output.errors || []) {
  console.error(e.formattedMessage);
}
if (errors.length > 0) {
  process.exit(1);
}

const token = output.contracts["Token.sol"].Token;
const tokenArtifact = {
  contractName: "Token",
  compiler: solc.version(),
  evmVersion: EVM_VERSION,
  openzeppelin: pkg.dependencies["@openzeppelin/contracts"],
  abi: token.abi,
  bytecode: "0x" + token.evm.bytecode.object,
  deployedBytecode: "0x" + token.evm.deployedBytecode.object,
  // The generator writes balances and allowances straight into storage; it checks these
  // slots against its own constants instead of trusting that OpenZeppelin never moves them.
  storageLayout: token.storageLayout.storage.map((s) => ({ label: s.label, slot: s.slot, offset: s.offset })),
};
fs.writeFileSync(path.join(out, "Token.json"), JSON.stringify(tokenArtifact, null, 2) + "\n");

// The published npm builds, copied verbatim: the pair bytecode must be exactly the one whose
// keccak the router's UniswapV2Library hard-codes, so it is not recompiled.
const uniswap = [
  ["@uniswap/v2-core/build/UniswapV2Factory.json", "UniswapV2Factory.json"],
  ["@uniswap/v2-core/build/UniswapV2Pair.json", "UniswapV2Pair.json"],
  ["@uniswap/v2-periphery/build/UniswapV2Router02.json", "UniswapV2Router02.json"],
  ["@uniswap/v2-periphery/build/WETH9.json", "WETH9.json"],
];
fs.mkdirSync(path.join(out, "uniswap"), { recursive: true });
for (const [src, dst] of uniswap) {
  fs.copyFileSync(path.join(here, "node_modules", src), path.join(out, "uniswap", dst));
}

console.log(`wrote Token.json (${solc.version()}) and ${uniswap.length} Uniswap V2 artifacts to ${out}`);
