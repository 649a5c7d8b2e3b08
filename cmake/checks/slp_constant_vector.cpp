// GCC 12.2's SLP vectorizer with AVX-512 (-march=native on an AVX-512 CPU)
// builds the constant {2, 2, 2, 0} as {2, 2, 2, 2}: std::vector<double>{2, 2,
// 2, 0} holds four 2s. Exit 1 when this compiler does that.
#include <vector>

int main() {
  const std::vector<double> v{2, 2, 2, 0};
  const std::vector<long long> w{3, 3, 3, 1};
  return (v[3] == 0 && w[3] == 1) ? 0 : 1;
}
