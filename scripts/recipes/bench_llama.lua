-- bench_llama.lua — bench_gpt.lua's throughput run (the same timing, JSON line and
-- command-line shapes) on a loom.llama model, for scripts/bench-llama, e.g.
--   build/loom run scripts/recipes/bench_llama.lua model.vocab=256 model.vocab_padded=256 \
--     model.ctx=64 model.layers=4 model.heads=4 model.kv_heads=2 model.dim=128 \
--     model.ffn_dim=384 model.tie_embeddings=true batch.micro=8 batch.seq=64 steps=32
local loom = require "loom"
BENCH_MODEL = loom.llama { vocab = 256, vocab_padded = 256, ctx = 64, layers = 4, heads = 4,
                           kv_heads = 2, dim = 128, ffn_dim = 384, tie_embeddings = true }
dofile(arg[0]:match("^(.*)/[^/]*$") .. "/bench_gpt.lua")
