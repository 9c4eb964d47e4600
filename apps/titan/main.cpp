// The `titan` command: train, inspect, bench. Each subcommand parses a TorchTitan-style job config.
#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  std::printf("usage: titan <train|inspect|bench> [--section.key value ...]\n");
  return argc > 1 ? 2 : 0;
}
