# README's C++ block must be examples/decode.cpp as it stands (the file CTest compiles and
# runs), so the snippet a new user copies compiles as written.
file(READ ${SRC}/README.md readme)
file(READ ${SRC}/examples/decode.cpp example)
string(FIND "${readme}" "```cpp\n${example}```\n" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md's ```cpp block differs from examples/decode.cpp: copy the file into it")
endif()
message(STATUS "README's C++ block is examples/decode.cpp")
