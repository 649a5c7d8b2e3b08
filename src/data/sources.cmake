# data/: datasets and loaders for the example models.
target_sources(loom PRIVATE
  data/text_corpus.cpp
  data/token_file.cpp
  data/token_loader.cpp
  data/token_prefetcher.cpp
)
