// One translation unit of xtask/bench/objects.sh's library with ~100 MB of DWARF (compiled 110 times
// with -DNS=ns0..ns109).
#include <map>
#include <string>
#include <vector>
#include <regex>
#include <functional>
#include <sstream>
#include <unordered_map>
#include <cstdlib>
namespace NS {
struct Key { int a; std::string b; bool operator<(const Key& o) const { return a < o.a; } };
struct Val { std::vector<std::string> v; std::map<std::string, double> m; };
std::map<Key, Val> table;
std::unordered_map<std::string, std::function<int(int)>> fns;
int work(int n) {
  std::regex re("([a-z]+)-([0-9]+)");
  std::ostringstream os; os << n;
  Key k{n, os.str()};
  table[k].v.push_back(os.str());
  fns[os.str()] = [n](int x) { return x + n; };
  return std::regex_match(os.str(), re) ? 1 : 0;
}
}
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
// ns0_alloc .. ns109_alloc: the allocation goes through this TU's own (C++) code.
extern "C" void *CAT(NS, _alloc)(unsigned long n) {
  NS::work((int)n);
  return std::malloc(n);
}
