// The program of one layer's link check (tests/CMakeLists.txt): linked with that layer's object
// files and those of the layers below it, nothing else. That it links at all is the check; run,
// it says which layer it was.
#include <cstdio>

int main(int argc, char** argv) {
  std::printf("layer %s: linked with the layers below it alone\n", argc > 1 ? argv[1] : "?");
  return 0;
}
