# data/: datasets and loaders for the examples and tests: byte-level text tokens
# (GPT) and GPT-2's BPE tokenizer, the digits images (ResNet) and synthetic batches.
target_sources(loom PRIVATE
  data/dataset.cpp
  data/digits.cpp
  data/gpt2_tokenizer.cpp
  data/sampler.cpp
  data/synthetic.cpp
  data/text_corpus.cpp
  data/token_file.cpp
  data/token_loader.cpp
  data/token_prefetcher.cpp
)
# zlib reads the compressed digits file; without it the loader takes a plain .csv.
find_package(ZLIB)
if(ZLIB_FOUND)
  target_link_libraries(loom PRIVATE ZLIB::ZLIB)
  set_source_files_properties(data/digits.cpp PROPERTIES COMPILE_DEFINITIONS LOOM_HAS_ZLIB=1)
endif()
