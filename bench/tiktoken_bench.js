#!/usr/bin/env node
// Encoding speed of the npm `tiktoken` package (OpenAI's Rust tiktoken compiled to WebAssembly)
// with its "gpt2" encoding on every *.txt of a folder, one document per file, one thread, as
// `titan tokenizer bench` does. Two passes (the first also warms up the JIT and WASM); prints one
// line per pass:  tiktoken pass=P docs=D bytes=B tokens=T seconds=S mb_per_s=R
//   node bench/tiktoken_bench.js PACKAGE_DIR CORPUS_DIR
'use strict';
const fs = require('fs');
const path = require('path');

const [packageDir, corpusDir] = process.argv.slice(2);
if (!packageDir || !corpusDir) {
  process.stderr.write('usage: tiktoken_bench.js PACKAGE_DIR CORPUS_DIR\n');
  process.exit(2);
}
const {get_encoding} = require(path.resolve(packageDir, 'tiktoken.cjs'));
const files = fs.readdirSync(corpusDir).filter((f) => f.endsWith('.txt')).sort();
const docs = files.map((f) => fs.readFileSync(path.join(corpusDir, f), 'utf-8'));
const bytes = docs.reduce((sum, d) => sum + Buffer.byteLength(d, 'utf-8'), 0);
const encoding = get_encoding('gpt2');
for (let pass = 1; pass <= 2; ++pass) {
  const start = process.hrtime.bigint();
  let tokens = 0;
  // encode_ordinary: special-token text is ordinary text, as in titan's GPT-2 files.
  for (const doc of docs) tokens += encoding.encode_ordinary(doc).length;
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  console.log(`tiktoken pass=${pass} docs=${docs.length} bytes=${bytes} tokens=${tokens} ` +
              `seconds=${seconds.toFixed(3)} mb_per_s=${(bytes / 1e6 / seconds).toFixed(2)}`);
}
encoding.free();
