// Attacks the wall-clock timeout and the CPU budget from C: spins forever.
int main(void) {
    volatile unsigned long n = 0;
    for (;;) n++;
}
