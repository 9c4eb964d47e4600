// Shared by the reference encoders (gpt2_reference_encode.js, hf_tokenizers_encode.js): writes the
// ids of INPUT_FILE in the format of `titan tokenizer encode`: ids space-separated, one output line
// per input line, or (mode '--whole') the whole input as one text on one line.
'use strict';
const fs = require('fs');

function writeIds(input, mode, idsOf) {
  const text = fs.readFileSync(input, 'utf-8');
  const out = [];
  if (mode === '--whole') {
    out.push(idsOf(text).join(' '));
  } else {
    const lines = text.split('\n');
    if (lines.length > 0 && lines[lines.length - 1] === '') lines.pop();
    for (const line of lines) out.push(idsOf(line).join(' '));
  }
  fs.writeSync(1, out.join('\n') + (out.length ? '\n' : ''));
}

module.exports = {writeIds};
