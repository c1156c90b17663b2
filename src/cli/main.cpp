#include <iostream>
int main() { std::cout << "dspark\n"; return 0; }
