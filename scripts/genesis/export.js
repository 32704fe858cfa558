// Writes the mainnet genesis allocation ({address: balance hex}) to the file named by argv[2].
const fs = require('fs');
const { getGenesis } = require('@ethereumjs/genesis');
const alloc = getGenesis(1);
if (!alloc || Object.keys(alloc).length !== 8893) {
  console.error('unexpected mainnet allocation from @ethereumjs/genesis');
  process.exit(1);
}
const out = {};
for (const [address, value] of Object.entries(alloc)) {
  out[address] = Array.isArray(value) ? value[0] : value;
}
fs.writeFileSync(process.argv[2], JSON.stringify(out));
