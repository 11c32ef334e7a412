// Attacks the compile step's time: a constant the compiler must evaluate by running
// 4e10 loop steps (each loop below g++'s per-loop limit), which takes it far longer than
// any timeout. The run's wall-clock timeout must stop the compiler.
constexpr long spin() {
    long s = 0;
    for (long i = 0; i < 200000; i++)
        for (long j = 0; j < 200000; j++) s += i ^ j;
    return s;
}
constexpr long value = spin();
int main() { return value & 1; }
