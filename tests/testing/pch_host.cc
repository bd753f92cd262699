// pch_host.cc — the one source of downpour_test_pch and downpour_test_pch_omp, the programs that
// build the precompiled headers the tests reuse (cmake/DownpourTest.cmake). They do nothing.
int main() { return 0; }
