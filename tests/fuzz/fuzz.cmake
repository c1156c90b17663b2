# The libFuzzer build (cmake -DDSPARK_FUZZ=ON with clang; `make fuzz`): only
# the fuzz targets, each linked with the parsers it drives, built with
# -fsanitize=fuzzer,address,undefined. The normal build replays the committed
# corpora through the same entry points (fuzz_replay.* tests).
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "DSPARK_FUZZ needs clang (CXX=clang++); got ${CMAKE_CXX_COMPILER_ID}")
endif()

set(DSPARK_FUZZ_SANITIZE -fsanitize=address,undefined -fno-sanitize-recover=undefined
    -fno-omit-frame-pointer -g)
# The readers every target may use (no tensor library).
add_library(dspark_fuzz_core STATIC
  src/io/gguf.cpp src/io/atomic_file.cpp src/io/regular_file.cpp
  src/tokenizer/bpe.cpp src/tokenizer/chat_template.cpp src/tokenizer/pretokenizer.cpp src/tokenizer/spm.cpp
  src/tokenizer/stream_decoder.cpp src/tokenizer/tokenizer.cpp src/tokenizer/utf8.cpp
  tests/fuzz/vocab.cpp)
target_include_directories(dspark_fuzz_core PUBLIC ${CMAKE_SOURCE_DIR}/include)
target_link_libraries(dspark_fuzz_core PUBLIC nlohmann_json::nlohmann_json PkgConfig::PCRE2)
target_compile_options(dspark_fuzz_core PUBLIC -fsanitize=fuzzer-no-link ${DSPARK_FUZZ_SANITIZE} ${DSPARK_WARNINGS})
target_link_options(dspark_fuzz_core PUBLIC ${DSPARK_FUZZ_SANITIZE})

# Per target: the further sources it drives.
set(DSPARK_FUZZ_SOURCES_safetensors src/io/safetensors_header.cpp)
set(DSPARK_FUZZ_SOURCES_drafter_config src/speculative/drafter_config.cpp)
set(DSPARK_FUZZ_SOURCES_http_request src/serve/api.cpp src/speculative/sampling.cpp src/speculative/seed_stable.cpp
    src/speculative/stats.cpp)
set(DSPARK_FUZZ_TORCH safetensors)

foreach(t ${DSPARK_FUZZ_TARGETS})
  add_executable(fuzz_${t} tests/fuzz/${t}.cpp ${DSPARK_FUZZ_SOURCES_${t}})
  target_link_libraries(fuzz_${t} PRIVATE dspark_fuzz_core)
  target_include_directories(fuzz_${t} PRIVATE ${CMAKE_SOURCE_DIR}/src)
  if(t IN_LIST DSPARK_FUZZ_TORCH)
    target_link_libraries(fuzz_${t} PRIVATE ${TORCH_LIBRARIES})
  endif()
  target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
endforeach()
