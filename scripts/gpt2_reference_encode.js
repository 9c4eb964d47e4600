#!/usr/bin/env node
// Reference GPT-2 token ids from the gpt-3-encoder package (fetched by fetch_gpt2_tokenizer.sh),
// in the format of `titan tokenizer encode`: ids space-separated, one output line per input line,
// or (--whole) the whole input as one text on one line.
//   node scripts/gpt2_reference_encode.js PACKAGE_DIR INPUT_FILE [--whole]
// The package's encode() concatenates arrays quadratically, so it is called once per pre-token
// piece (a piece re-splits into itself) and the ids are appended.
'use strict';
const fs = require('fs');
const path = require('path');
const {writeIds} = require(path.join(__dirname, 'encode_lines.js'));

const [packageDir, input, mode] = process.argv.slice(2);
if (!packageDir || !input) {
  process.stderr.write('usage: gpt2_reference_encode.js PACKAGE_DIR INPUT_FILE [--whole]\n');
  process.exit(2);
}
const {encode} = require(path.resolve(packageDir, 'Encoder.js'));
// GPT-2's pre-tokenizer regex, as in the package.
const pat = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

function ids_of(text) {
  const ids = [];
  for (const m of text.matchAll(pat)) {
    for (const id of encode(m[0])) ids.push(id);
  }
  return ids;
}

writeIds(input, mode, ids_of);
