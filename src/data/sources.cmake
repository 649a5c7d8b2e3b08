# data/: datasets and loaders for the examples and tests: byte-level text tokens
# (GPT), the digits images (ResNet) and synthetic batches.
target_sources(loom PRIVATE
  data/dataset.cpp
  data/digits.cpp
  data/synthetic.cpp
  data/text_corpus.cpp
  data/token_file.cpp
  data/token_loader.cpp
  data/token_prefetcher.cpp
)
